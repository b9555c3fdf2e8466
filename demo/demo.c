/*
 * demo: a small program with recognizable allocation patterns, profiled by
 * `cargo xtask demo`.
 *
 *   load_records     2,000 records of 256 bytes, kept         (live 512,000 B)
 *   build_index      one calloc'd table of 4,096 pointers, kept (live 32,768 B)
 *   scratch_buffers  10,000 temporary 1 KiB buffers, freed     (live 0)
 *   grow_log         a log grown by realloc, 64 B -> 64 KiB     (live 65,536 B)
 *
 * Built with -O1, so each function is marked noinline to keep its own frame,
 * and every result feeds a global, so no allocation is optimized away.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECORDS 2000
#define RECORD_SIZE 256
#define INDEX_SLOTS 4096
#define SCRATCH_BUFFERS 10000
#define SCRATCH_SIZE 1024

struct record {
    unsigned id;
    char payload[RECORD_SIZE - sizeof(unsigned)];
};

struct record *records[RECORDS];
struct record **index_table;
char *log_buf;
volatile unsigned long checksum;

__attribute__((noinline)) void load_records(void) {
    for (unsigned i = 0; i < RECORDS; i++) {
        records[i] = malloc(sizeof(struct record));
        records[i]->id = i;
        snprintf(records[i]->payload, sizeof records[i]->payload, "record %u", i);
    }
}

__attribute__((noinline)) void build_index(void) {
    index_table = calloc(INDEX_SLOTS, sizeof *index_table);
    for (unsigned i = 0; i < RECORDS; i++)
        index_table[(i * 2654435761u) % INDEX_SLOTS] = records[i];
}

__attribute__((noinline)) void scratch_buffers(void) {
    for (unsigned i = 0; i < SCRATCH_BUFFERS; i++) {
        char *buf = malloc(SCRATCH_SIZE);
        memset(buf, (int)i, SCRATCH_SIZE);
        checksum += (unsigned char)buf[i % SCRATCH_SIZE];
        free(buf);
    }
}

__attribute__((noinline)) void grow_log(void) {
    size_t size = 64;
    log_buf = malloc(size);
    while (size < 64 * 1024) {
        size *= 2;
        log_buf = realloc(log_buf, size);
        log_buf[size - 1] = 0;
    }
}

int main(void) {
    load_records();
    build_index();
    scratch_buffers();
    grow_log();
    printf("demo: %d records indexed, checksum %lu\n", RECORDS, checksum);
    return 0;
}
