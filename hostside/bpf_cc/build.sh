#!/bin/sh
# build.sh OUT_DIR CC...: compile each congestion control's CC/CC.bpf.c into OUT_DIR/CC.bpf.o
# (CO-RE: one object for every kernel with BTF) and the loader into OUT_DIR/trialbed-bpf-cc.
# Needs clang, libbpf-dev and a C compiler (Debian: clang libbpf-dev gcc libc6-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR CC...}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
for cc in "$@"; do
  # -g: struct_ops needs the object's BTF. Compiled from here by relative paths, with no
  # directory of the build's in it: the same source gives the same object anywhere.
  # -Werror: a warning is a bug here.
  (cd "$here" && clang -g -O2 -target bpf -Wall -Werror -fdebug-compilation-dir=. \
    -c "$cc/$cc.bpf.c" -o "$out/$cc.bpf.o.tmp")
  mv "$out/$cc.bpf.o.tmp" "$out/$cc.bpf.o"
done
cc -O2 -Wall -Wextra -Werror -o "$out/trialbed-bpf-cc.tmp" "$here/trialbed_bpf_cc.c" -lbpf
mv "$out/trialbed-bpf-cc.tmp" "$out/trialbed-bpf-cc"
