#!/bin/sh
# build.sh OUT_DIR CC[:NAME]...: compile each congestion control's CC/CC.bpf.c into OUT_DIR/CC.bpf.o
# (CO-RE: one object for every kernel with BTF) and the loader into OUT_DIR/trialbed-bpf-cc.
# CC:NAME: the same source as a congestion control named NAME (OUT_DIR/NAME.bpf.o), to register
# beside a kernel's own CC (bpf_cc.h: BPF_CC_NAME).
# Needs clang, libbpf-dev and a C compiler (Debian: clang libbpf-dev gcc libc6-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR CC...}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
for arg in "$@"; do
  cc=${arg%%:*}
  name=${arg#*:}
  rename=
  [ "$name" = "$cc" ] || rename=-DBPF_CC_RENAME=$name
  # -g: struct_ops needs the object's BTF. Compiled from here by relative paths, with no
  # directory of the build's in it: the same source gives the same object anywhere.
  # -Werror: a warning is a bug here.
  (cd "$here" && clang -g -O2 -target bpf -Wall -Werror -fdebug-compilation-dir=. $rename \
    -c "$cc/$cc.bpf.c" -o "$out/$name.bpf.o.tmp")
  mv "$out/$name.bpf.o.tmp" "$out/$name.bpf.o"
done
cc -O2 -Wall -Wextra -Werror -o "$out/trialbed-bpf-cc.tmp" "$here/trialbed_bpf_cc.c" -lbpf
mv "$out/trialbed-bpf-cc.tmp" "$out/trialbed-bpf-cc"
