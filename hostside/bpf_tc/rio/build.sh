#!/bin/sh
# build.sh OBJECT: compile rio.bpf.c (beside this script) into OBJECT, as ../../bpf_cc/build.sh
# compiles its programs: -g (the loader finds the parameters in the object's BTF), -Werror (a
# warning is a bug here), compiled from here by a relative path so that the same source gives
# the same object anywhere. Needs clang and libbpf-dev (Debian packages).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
obj=${1:?usage: build.sh OBJECT}
mkdir -p "$(dirname "$obj")"
obj=$(cd "$(dirname "$obj")" && pwd)/$(basename "$obj")
(cd "$here" && clang -g -O2 -target bpf -Wall -Werror -fdebug-compilation-dir=. \
  -c rio.bpf.c -o "$obj.tmp")
mv "$obj.tmp" "$obj"
