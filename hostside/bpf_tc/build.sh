#!/bin/sh
# build.sh OUT_DIR PROGRAM...: compile each tc program's PROGRAM/PROGRAM.bpf.c into
# OUT_DIR/PROGRAM.bpf.o (one object for every kernel: it reads only UAPI structures) and the
# loader into OUT_DIR/trialbed-bpf-tc. Needs clang, libbpf-dev and a C compiler (Debian:
# clang libbpf-dev gcc libc6-dev), as ../bpf_cc/build.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR PROGRAM...}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
for prog in "$@"; do
  # PROGRAM is a folder here, or (the tests' own programs) a path to a NAME.bpf.c.
  case $prog in
    *.bpf.c) src=$(cd "$(dirname "$prog")" && pwd)/$(basename "$prog"); prog=$(basename "$prog" .bpf.c) ;;
    *) src=$prog/$prog.bpf.c ;;
  esac
  # -g: the loader finds the parameters, and the kernel the spin lock, in the object's BTF.
  # Compiled from here by relative paths, with no directory of the build's in it: the same
  # source gives the same object anywhere. -Werror: a warning is a bug here.
  (cd "$here" && clang -g -O2 -target bpf -Wall -Werror -fdebug-compilation-dir=. -I. \
    -c "$src" -o "$out/$prog.bpf.o.tmp")
  mv "$out/$prog.bpf.o.tmp" "$out/$prog.bpf.o"
done
cc -O2 -Wall -Wextra -Werror -o "$out/trialbed-bpf-tc.tmp" "$here/trialbed_bpf_tc.c" \
  "$here/loader_params.c" -lbpf
mv "$out/trialbed-bpf-tc.tmp" "$out/trialbed-bpf-tc"
