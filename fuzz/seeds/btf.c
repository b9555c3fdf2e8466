/* The btf target's seed (make-seeds.sh): the kernel structs whose
 * members memprof asks the offsets of, as gcc -gbtf writes their BTF
 * (typedefs, qualifiers, bitfields, anonymous unions and structs). */
typedef unsigned long u64;
typedef unsigned int u32;
struct thread_struct {
    unsigned long tls_array[3];
    unsigned long sp;
    unsigned short es, ds, fsindex, gsindex;
    unsigned long fsbase;
};
struct task_struct {
    volatile long state;
    int pid;
    int tgid;
    const struct thread_struct thread;
};
struct dentry;
struct dentry {
    u32 d_flags;
    struct dentry *d_parent;
};
struct path {
    void *mnt;
    struct dentry *dentry;
};
struct inode {
    unsigned short i_mode;
    unsigned long i_ino;
};
struct file {
    union {
        void *f_llist;
        unsigned int f_iocb_flags;
    };
    struct path f_path;
    struct inode *f_inode;
};
typedef const struct file file_t;
struct vm_area_struct {
    union {
        struct {
            u64 vm_start;
            u64 vm_end;
        };
        void *rcu;
    };
    unsigned int vm_pgoff : 12;
    const volatile u64 vm_flags;
    file_t *vm_file;
};
struct task_struct t;
struct vm_area_struct v;
struct inode i;
