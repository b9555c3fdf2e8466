#!/bin/sh
# Writes the seed inputs of the fuzz targets' corpora (fuzz/corpus/TARGET/
# seed-*) from the sources here; `cargo xtask fuzz --keep` minimizes a
# corpus with what runs found. Run from anywhere; needs gcc and objcopy.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
corpus="$here/../corpus"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$corpus/eh_frame" "$corpus/elf_module" "$corpus/symbolize" "$corpus/btf"

# ELF files: a PIE with DWARF, the same with compressed DWARF, stripped,
# and a versioned shared object without .symtab.
gcc -O1 -g -o "$tmp/tiny" "$here/tiny.c"
gcc -O1 -g -gz=zlib -o "$tmp/tiny-gz" "$here/tiny.c"
gcc -O1 -s -o "$tmp/tiny-stripped" "$here/tiny.c"
gcc -O1 -shared -fPIC -s -Wl,--version-script="$here/tiny.map" -o "$tmp/tiny.so" "$here/tiny.c"
for elf in tiny tiny-gz tiny-stripped tiny.so; do
    for target in eh_frame elf_module symbolize; do
        cp "$tmp/$elf" "$corpus/$target/seed-$elf"
    done
done
# The eh_frame target also reads an input as the .eh_frame section alone.
objcopy --dump-section .eh_frame="$corpus/eh_frame/seed-section" "$tmp/tiny" "$tmp/ignored"

# BTF: the section gcc writes.
gcc -gbtf -c -o "$tmp/btf.o" "$here/btf.c"
objcopy --dump-section .BTF="$corpus/btf/seed-structs" "$tmp/btf.o" "$tmp/ignored"

# Names: C++ (templates, back-references, a doubling one), Rust (legacy
# and v0, with back-references), Crystal's, C's.
mkdir -p "$corpus/demangle"
i=0
for name in \
    '_ZNSt6vectorIiSaIiEE9push_backERKi' \
    '_ZN3foo3barIiEEvT_' \
    '_ZNKSt8functionIFiiEEclEi' \
    '_ZZ4mainENKUliE_clEi' \
    '_Z1f1A1BIS_S_ES0_IS1_S1_ES0_IS2_S2_E' \
    '_ZN4core3ptr13drop_in_place17h0123456789abcdefE' \
    '_RNvCs1234_7mycrate3foo' \
    '_RINvCs1234_7mycrate3fooTB4_B4_EE' \
    '*Foo::new<Int32>:Foo' \
    '*Array(Foo)@Array(T)#push<Foo>:Array(Foo)' \
    '*Hash(String, NamedTuple(a: Int32))#[]=<String, NamedTuple(a: Int32)>:Nil' \
    '~proc2Proc(Int32, Nil)@src/app.cr:12' \
    '~Foo::BAR:init' \
    '__crystal_main' \
    'malloc'; do
    i=$((i + 1))
    printf '%s' "$name" > "$corpus/demangle/seed-$i"
done

# Queries of the agent's routes.
mkdir -p "$corpus/agent_query"
i=0
for query in \
    'pid=1' \
    'comm=app&format=markdown&top=3' \
    'pid=1&format=html&function=%5Emake&min_bytes=0' \
    'pid=1&format=pprof&leaks' \
    'comm=app&seconds=x' \
    'pid=1&format=folded&kind=libc,gc&size_min=10&size_max=5' \
    'pid=1&format=tsv&depth=2&skip=1&skip_runtime=false&temporary&temporary_ms=5' \
    'pid=2' \
    'pid=1&format=json&exclude_function=(a%7Cb)*&source=x.c' \
    'pid=1&format=flamegraph&count=objects&inverted=1&total=true' \
    'pid=1&format=timeline' \
    'pid=1&format=types&leaked=1' \
    'pid=1&format=mprof' \
    'pid=1&comm=app' \
    'comm=app&format=json&leaks=true&total=1'; do
    i=$((i + 1))
    printf '%s' "$query" > "$corpus/agent_query/seed-$i"
done

# Profiles (not remade here: they need root, memprof and crystal):
#   memprof run -o tiny.mprof -- ./tiny        (gcc -O1 -g tiny.c)
#   memprof run --census both --sample-period 20 -o gc.mprof -- ./gc   (crystal build gc.cr)
#   trim-mprof.py gc.mprof gc-small.mprof 4
# are corpus/mprof/seed-c and seed-crystal, each also as its JSON alone
# (seed-*-json: the target reads an input as a file's JSON too); the
# agent_query target serves gc-small.mprof (seeds/agent_query.mprof).

# Crystal sources: the one here, and some of the tests' fixtures.
mkdir -p "$corpus/crystal_source"
cp "$here/nested.cr" "$corpus/crystal_source/seed-nested.cr"
cp "$here/gc.cr" "$corpus/crystal_source/seed-gc.cr"
for f in classes collected allocs; do
    cp "$here/../../tests/fixtures/crystal/$f.cr" "$corpus/crystal_source/seed-$f.cr"
done
