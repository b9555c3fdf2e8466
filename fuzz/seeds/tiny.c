/* The ELF seeds of the eh_frame, elf_module and symbolize targets
 * (make-seeds.sh): a small program with a few functions, an inlined
 * one, thread-local storage and a name of Crystal's shape. */
#include <stdlib.h>

__thread int counter;

static inline int twice(int n) { return 2 * n; }

__attribute__((noinline)) void *make_foo(int n) {
    counter += twice(n);
    return malloc(n + counter);
}

/* A symbol named as Crystal names its methods. */
__attribute__((noinline, used)) void *crystal_new(int n) __asm__("\"*Foo::new<Int32>:Foo\"");
__attribute__((noinline, used)) void *crystal_new(int n) { return calloc(1, n); }

int main(int argc, char **argv) {
    void *p = make_foo(argc * 100);
    free(p);
    return crystal_new(argc) == 0;
}
