/* The C launcher: vfork, confine, exec, in one C call.
 *
 * The vfork creates the child straight in the jail's cgroup v2 where it can
 * (clone3 with CLONE_INTO_CGROUP, see clone3_vfork); the child joins any
 * other cgroup it is given first thing (see _lifetime.py). Everything that
 * needs the engine's privileges (the bridge mounts of _reach.py, joining a
 * landlock jail's own network namespace (_netns.py), and on kernels before
 * 5.16 the cgroup writes) comes before the switch to the
 * jail's uid; the parent-death signal comes after it (a uid change clears it).
 *
 * For landlock, the exec helper (_forkserver.py) builds the Landlock ruleset
 * and the seccomp program; this module only starts the item with them. For
 * bwrap, the engine's launcher thread (_direct.py) starts bwrap with it,
 * with neither (bwrap confines itself). Forking a Python process costs
 * about a millisecond on a virtual machine (page tables, then copy-on-write
 * faults in the parent), and running a second program first costs another
 * exec; vfork here costs neither. The child runs only
 * system calls: raw set*id syscalls (glibc's wrappers would signal the
 * parent's threads), then execve or _exit(127) after writing why to the
 * item's stderr, as a shell reports a command it cannot run.
 *
 * Optional: built by setup.py where a C compiler is present. Without it the
 * landlock helper forks Python and bwrap goes through the exec helper
 * (same confinement, slower), and doctor says so.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#define JAIL_CLONE_VM 0x100ULL
#define JAIL_CLONE_VFORK 0x4000ULL
#define JAIL_CLONE_INTO_CGROUP 0x200000000ULL

#define MAX_FDS 64
#define MAX_LIMITS 8
#define MAX_BINDS 16
#define MAX_CGROUPS 4

/* Bridge plan (see _reach.BridgePlan): NULL-terminated path lists. */
struct bridge {
    char **tmpfs, **dirs, **files, **binds;
    int nbinds;
};

struct launch {
    const char *exe;
    char *const *argv;
    char *const *envp;
    const char *cwd;
    int fds[MAX_FDS];
    int nfds;
    int ruleset_fd;
    struct sock_fprog prog;
    long uid, gid;
    struct bridge *bridge;
    int limit_res[MAX_LIMITS];
    unsigned long long limit_val[MAX_LIMITS];
    int nlimits;
    int cgroup_fds[MAX_CGROUPS];
    int ncgroups;
    int cgroup_first; /* 1: started in cgroup_fds[0]'s cgroup already */
    int netns_fd;     /* a network namespace to join before the uid change, or -1 */
    pid_t parent;
};

/* clone3's arguments (linux/sched.h, version 2), spelled out for old headers. */
struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};

static void put(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void fail(const char *stage) {
    /* strerror is not async-signal-safe in general; glibc's table lookup is,
     * and only this process (which is about to exit) sees the result. */
    int err = errno;
    put("stockade: cannot start the jail (");
    put(stage);
    put("): ");
    put(strerror(err));
    put("\n");
    _exit(127);
}

/* In a private mount namespace: clone each bound folder while it is still
 * visible, cover the first folder the jail cannot search with an empty tmpfs,
 * make the chain of mount points in it, and attach the clones at their host
 * paths. Runs as root, before the uid drops; nothing leaves this namespace. */
static int bridge(const struct bridge *b) {
    int trees[MAX_BINDS];
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return -1;
    for (int i = 0; i < b->nbinds; i++) {
        trees[i] = (int)syscall(SYS_open_tree, AT_FDCWD, b->binds[i],
                                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
        if (trees[i] < 0)
            return -1;
    }
    for (char **p = b->tmpfs; *p != NULL; p++) {
        if (mount("tmpfs", *p, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755") != 0)
            return -1;
    }
    for (char **p = b->dirs; *p != NULL; p++) {
        if ((mkdir(*p, 0755) != 0 && errno != EEXIST) || chmod(*p, 0755) != 0)
            return -1;
    }
    for (char **p = b->files; *p != NULL; p++) {
        int fd = open(*p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return -1;
        close(fd);
    }
    for (int i = 0; i < b->nbinds; i++) {
        if (syscall(SYS_move_mount, trees[i], "", AT_FDCWD, b->binds[i], MOVE_MOUNT_F_EMPTY_PATH) != 0)
            return -1;
        close(trees[i]);
    }
    return 0;
}

static __attribute__((noreturn, noinline)) void child(struct launch *l) {
    const char *stage = "setup";
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    /* A Python handler must never run here; ignored SIGPIPE and SIGXFSZ
     * would stay ignored across exec. */
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        if (sigaction(sig, NULL, &old) != 0)
            continue;
        if (old.sa_handler != SIG_DFL &&
            (old.sa_handler != SIG_IGN || sig == SIGPIPE || sig == SIGXFSZ))
            sigaction(sig, &dfl, NULL);
    }
    /* Join the jail's cgroups before anything else (writing 0 moves the
     * writer): every process the jail ever starts is then in them, whatever
     * session it makes. First, as the fds below may land on these numbers,
     * and before the uid change (Linux 5.16 and later check the credentials
     * the fds were opened with, earlier kernels the writer's); a failure is
     * reported once the item's stderr is in place. */
    int cgroup_errno = 0;
    for (int i = l->cgroup_first; i < l->ncgroups && cgroup_errno == 0; i++) {
        if (write(l->cgroup_fds[i], "0", 1) != 1)
            cgroup_errno = errno ? errno : EIO;
    }
    /* stdin, stdout, stderr, extras: copies above the targets first, so no
     * dup2 overwrites a source; everything else closes at exec. */
    int high[MAX_FDS];
    int ruleset = -1, netns = -1;
    if (l->ruleset_fd >= 0 && (ruleset = fcntl(l->ruleset_fd, F_DUPFD_CLOEXEC, 1024)) < 0)
        _exit(127);
    if (l->netns_fd >= 0 && (netns = fcntl(l->netns_fd, F_DUPFD_CLOEXEC, 1024)) < 0)
        _exit(127);
    for (int i = 0; i < l->nfds; i++) {
        high[i] = fcntl(l->fds[i], F_DUPFD_CLOEXEC, 1024);
        if (high[i] < 0)
            _exit(127);
    }
    for (int i = 0; i < l->nfds; i++) {
        if (dup2(high[i], i) < 0)
            _exit(127);
    }
    if (syscall(SYS_close_range, (unsigned)l->nfds, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
        fail(stage);
    if (cgroup_errno != 0) {
        errno = cgroup_errno;
        fail("cgroup");
    }
    if (setsid() < 0)
        fail(stage);
    stage = "rlimits";
    for (int i = 0; i < l->nlimits; i++) {
        struct rlimit rl = {(rlim_t)l->limit_val[i], (rlim_t)l->limit_val[i]};
        if (setrlimit(l->limit_res[i], &rl) != 0)
            fail(stage);
    }
    if (l->bridge != NULL) {
        stage = "bridge mounts";
        if (bridge(l->bridge) != 0)
            fail(stage);
    }
    if (netns >= 0) {
        /* The item's own network namespace (only lo and the engine's relay,
         * see _netns.py): joining needs CAP_SYS_ADMIN, so before the uid. */
        stage = "network namespace";
        if (setns(netns, CLONE_NEWNET) != 0)
            fail(stage);
        close(netns);
    }
    stage = "chdir";
    if (chdir(l->cwd) != 0)
        fail(stage);
    if (l->uid >= 0) {
        stage = "setuid";
        if (syscall(SYS_setgroups, 0, NULL) != 0 || syscall(SYS_setgid, (gid_t)l->gid) != 0 ||
            syscall(SYS_setuid, (uid_t)l->uid) != 0)
            fail(stage);
    }
    /* After the uid change: changing credentials clears the death signal. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        fail("setup");
    if (getppid() != l->parent)
        _exit(127); /* the helper died before the death signal was set */
    if (ruleset >= 0) {
        stage = "landlock";
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            syscall(SYS_landlock_restrict_self, ruleset, 0) != 0)
            fail(stage);
    }
    if (l->prog.len > 0) {
        stage = "seccomp";
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &l->prog, 0, 0) != 0)
            fail(stage);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    stage = "exec";
    execve(l->exe, l->argv, l->envp);
    fail(stage);
    _exit(127);
}

/* vfork, but straight into a cgroup v2 (clone3 with CLONE_INTO_CGROUP).
 *
 * Joining a cgroup by writing to cgroup.procs takes the kernel's threadgroup
 * lock for writing, which waits for an RCU grace period unless another
 * migration happened within the last one: milliseconds on a busy host, with
 * this thread suspended meanwhile. A child created in the cgroup migrates
 * nothing. Like vfork, the child shares our memory until it execs; it runs
 * child() on `stack` (in the caller's frame, unused by the suspended caller).
 * glibc has no clone3 wrapper that calls a function on a new stack, hence
 * these few instructions; elsewhere the caller falls back to vfork and a
 * write. Returns the child's pid or -errno (nothing was created). */
#if defined(__x86_64__)
#define HAVE_CLONE3_VFORK 1
static long clone3_vfork(struct clone3_args *args, struct launch *l) {
    register long rax __asm__("rax") = SYS_clone3;
    register struct clone3_args *rdi __asm__("rdi") = args;
    register long rsi __asm__("rsi") = (long)sizeof *args;
    register void (*r12)(struct launch *) __asm__("r12") = child;
    register struct launch *r13 __asm__("r13") = l;
    __asm__ volatile("syscall\n\t"
                     "testq %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     /* The child, on the new stack (16-byte aligned). */
                     "xorl %%ebp, %%ebp\n\t"
                     "movq %%r13, %%rdi\n\t"
                     "callq *%%r12\n\t"
                     "ud2\n\t"
                     "1:\n\t"
                     : "+r"(rax)
                     : "r"(rdi), "r"(rsi), "r"(r12), "r"(r13)
                     : "rcx", "r11", "memory", "cc");
    return rax;
}
#elif defined(__aarch64__)
#define HAVE_CLONE3_VFORK 1
static long clone3_vfork(struct clone3_args *args, struct launch *l) {
    register long x0 __asm__("x0") = (long)args;
    register long x1 __asm__("x1") = (long)sizeof *args;
    register long x8 __asm__("x8") = SYS_clone3;
    register void (*x19)(struct launch *) __asm__("x19") = child;
    register struct launch *x20 __asm__("x20") = l;
    __asm__ volatile("svc #0\n\t"
                     "cbnz x0, 1f\n\t"
                     "mov x29, xzr\n\t"
                     "mov x0, x20\n\t"
                     "blr x19\n\t"
                     "brk #0\n\t"
                     "1:\n\t"
                     : "+r"(x0)
                     : "r"(x1), "r"(x8), "r"(x19), "r"(x20)
                     : "x30", "memory", "cc");
    return x0;
}
#endif

/* A NULL-terminated array of the bytes objects in seq. Their buffers are
 * borrowed from *keep, a tuple of strong references that the caller holds
 * until the child has exec'd (the GIL is released meanwhile, and another
 * thread could change a list). */
static char **cstrings(PyObject *seq, const char *what, PyObject **keep) {
    PyObject *items = PySequence_Tuple(seq);
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    char **out = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (out == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyBytes_Check(item)) {
            PyErr_Format(PyExc_TypeError, "%s: bytes expected", what);
            PyMem_Free(out);
            Py_DECREF(items);
            return NULL;
        }
        out[i] = PyBytes_AS_STRING(item);
        if ((Py_ssize_t)strlen(out[i]) != PyBytes_GET_SIZE(item)) {
            /* execve would see a shorter string than the caller meant */
            PyErr_Format(PyExc_ValueError, "%s: embedded null byte", what);
            PyMem_Free(out);
            Py_DECREF(items);
            return NULL;
        }
    }
    *keep = items;
    return out;
}

static void free_lists(char **lists[4], PyObject *keep[4]) {
    for (int i = 0; i < 4; i++) {
        PyMem_Free(lists[i]);
        Py_XDECREF(keep[i]);
        lists[i] = NULL;
        keep[i] = NULL;
    }
}

static PyObject *jail_spawn(PyObject *self, PyObject *args) {
    (void)self;
    struct launch l;
    memset(&l, 0, sizeof l);
    PyObject *argv_obj, *env_obj, *fds_obj, *limits_obj, *bridge_obj = Py_None, *cgroups_obj = NULL;
    int cgroup_dir = -1;
    l.netns_fd = -1;
    const char *exe, *cwd;
    const char *prog;
    Py_ssize_t prog_len;
    if (!PyArg_ParseTuple(args, "yOOyOiy#llO|OOii:spawn", &exe, &argv_obj, &env_obj, &cwd,
                          &fds_obj, &l.ruleset_fd, &prog, &prog_len, &l.uid, &l.gid, &limits_obj,
                          &bridge_obj, &cgroups_obj, &cgroup_dir, &l.netns_fd))
        return NULL;
    if (prog_len % sizeof(struct sock_filter) != 0 || prog_len / 8 > 0xffff) {
        PyErr_SetString(PyExc_ValueError, "seccomp program: a whole number of instructions");
        return NULL;
    }
    l.exe = exe;
    l.cwd = cwd;
    l.prog.len = (unsigned short)(prog_len / sizeof(struct sock_filter));
    l.prog.filter = (struct sock_filter *)prog;

    PyObject *fast = PySequence_Fast(fds_obj, "fds");
    if (fast == NULL)
        return NULL;
    l.nfds = (int)PySequence_Fast_GET_SIZE(fast);
    if (l.nfds < 3 || l.nfds > MAX_FDS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "fds: stdin, stdout, stderr and at most 61 more");
        return NULL;
    }
    for (int i = 0; i < l.nfds; i++)
        l.fds[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    if (PyErr_Occurred())
        return NULL;

    fast = PySequence_Fast(limits_obj, "limits");
    if (fast == NULL)
        return NULL;
    l.nlimits = (int)PySequence_Fast_GET_SIZE(fast);
    if (l.nlimits > MAX_LIMITS) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "limits: too many");
        return NULL;
    }
    for (int i = 0; i < l.nlimits; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyArg_ParseTuple(pair, "iK", &l.limit_res[i], &l.limit_val[i])) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);

    if (cgroups_obj != NULL) {
        fast = PySequence_Fast(cgroups_obj, "cgroups");
        if (fast == NULL)
            return NULL;
        l.ncgroups = (int)PySequence_Fast_GET_SIZE(fast);
        if (l.ncgroups > MAX_CGROUPS) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_ValueError, "cgroups: at most 4");
            return NULL;
        }
        for (int i = 0; i < l.ncgroups; i++)
            l.cgroup_fds[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        Py_DECREF(fast);
        if (PyErr_Occurred())
            return NULL;
    }

    struct bridge plan;
    PyObject *plan_keep[4] = {NULL, NULL, NULL, NULL};
    char **plan_lists[4] = {NULL, NULL, NULL, NULL};
    if (bridge_obj != Py_None) {
        if (!PyTuple_Check(bridge_obj) || PyTuple_GET_SIZE(bridge_obj) != 4) {
            PyErr_SetString(PyExc_TypeError, "bridge: (tmpfs, dirs, files, binds) or None");
            return NULL;
        }
        static const char *names[4] = {"bridge tmpfs", "bridge dirs", "bridge files", "bridge binds"};
        for (int i = 0; i < 4; i++) {
            plan_lists[i] = cstrings(PyTuple_GET_ITEM(bridge_obj, i), names[i], &plan_keep[i]);
            if (plan_lists[i] == NULL) {
                free_lists(plan_lists, plan_keep);
                return NULL;
            }
        }
        plan.tmpfs = plan_lists[0];
        plan.dirs = plan_lists[1];
        plan.files = plan_lists[2];
        plan.binds = plan_lists[3];
        plan.nbinds = (int)PyTuple_GET_SIZE(plan_keep[3]);
        if (plan.nbinds > MAX_BINDS) {
            free_lists(plan_lists, plan_keep);
            PyErr_SetString(PyExc_ValueError, "bridge: at most 16 binds");
            return NULL;
        }
        l.bridge = &plan;
    }

    PyObject *argv_keep = NULL, *env_keep = NULL;
    char **argv = cstrings(argv_obj, "argv", &argv_keep);
    if (argv == NULL) {
        free_lists(plan_lists, plan_keep);
        return NULL;
    }
    char **envp = cstrings(env_obj, "env", &env_keep);
    if (envp == NULL) {
        PyMem_Free(argv);
        Py_DECREF(argv_keep);
        free_lists(plan_lists, plan_keep);
        return NULL;
    }
    l.argv = argv;
    l.envp = envp;
    l.parent = getpid();

    /* No signal handler may run in the child while it shares our memory.
     * The GIL is released: this thread is suspended until the child execs
     * (bwrap's exec alone is a fraction of a millisecond), and the child
     * touches no Python object, only the C copies above. */
    sigset_t all, old_mask;
    pid_t pid = -1;
    int saved = 0;
#ifdef HAVE_CLONE3_VFORK
    char stack[32768] __attribute__((aligned(16)));
#endif
    sigfillset(&all);
    Py_BEGIN_ALLOW_THREADS
    pthread_sigmask(SIG_SETMASK, &all, &old_mask);
#ifdef HAVE_CLONE3_VFORK
    if (cgroup_dir >= 0 && l.ncgroups > 0) {
        struct clone3_args ca;
        memset(&ca, 0, sizeof ca);
        ca.flags = JAIL_CLONE_VM | JAIL_CLONE_VFORK | JAIL_CLONE_INTO_CGROUP;
        ca.exit_signal = SIGCHLD;
        ca.stack = (uint64_t)(uintptr_t)stack;
        ca.stack_size = sizeof stack;
        ca.cgroup = (uint64_t)cgroup_dir;
        l.cgroup_first = 1; /* cgroup_fds[0] is that cgroup's cgroup.procs */
        long r = clone3_vfork(&ca, &l);
        if (r > 0)
            pid = (pid_t)r;
        l.cgroup_first = 0; /* refused (old kernel, seccomp): vfork and write */
    }
#endif
    if (pid < 0) {
        pid = vfork();
        if (pid == 0)
            child(&l);
        saved = errno;
    }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    Py_END_ALLOW_THREADS
    PyMem_Free(argv);
    PyMem_Free(envp);
    Py_DECREF(argv_keep);
    Py_DECREF(env_keep);
    free_lists(plan_lists, plan_keep);
    if (pid < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong((long)pid);
}

/* SIGKILL every process of a uid, from a vforked child that takes that uid:
 * kill(-1) reaches exactly the processes the uid may signal (in every pid
 * namespace below ours), never the caller, never anyone else. */
static PyObject *jail_kill_uid(PyObject *self, PyObject *args) {
    (void)self;
    long uid;
    if (!PyArg_ParseTuple(args, "l:kill_uid", &uid))
        return NULL;
    if (uid <= 0) {
        PyErr_SetString(PyExc_ValueError, "kill_uid: never uid 0");
        return NULL;
    }
    sigset_t all, old_mask;
    pid_t pid;
    int status = 0, saved = 0;
    sigfillset(&all);
    Py_BEGIN_ALLOW_THREADS
    pthread_sigmask(SIG_SETMASK, &all, &old_mask);
    pid = vfork();
    if (pid == 0) {
        if (syscall(SYS_setgroups, 0, NULL) != 0 ||
            syscall(SYS_setresgid, (gid_t)uid, (gid_t)uid, (gid_t)uid) != 0 ||
            syscall(SYS_setresuid, (uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
            _exit(126);
        if (kill(-1, SIGKILL) != 0 && errno != ESRCH)
            _exit(125);
        _exit(0);
    }
    saved = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (pid > 0) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
    Py_END_ALLOW_THREADS
    if (pid < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        PyErr_Format(PyExc_OSError, "kill_uid(%ld): the killer could not %s", uid,
                     WIFEXITED(status) && WEXITSTATUS(status) == 125 ? "signal" : "take the uid");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"spawn", jail_spawn, METH_VARARGS,
     "spawn(exe, argv, env, cwd, fds, ruleset_fd, seccomp, uid, gid, limits, bridge=None,\n"
     "      cgroups=(), cgroup_dir=-1, netns=-1) -> pid\n\n"
     "vfork (into the cgroup v2 directory cgroup_dir, whose cgroup.procs is cgroups[0]);\n"
     "in the child join the other cgroups, place fds on 0.., start a session, set the\n"
     "rlimits, make the bridge mounts, join the network namespace netns, the cwd, the\n"
     "uid, the parent-death signal, Landlock and seccomp; execve."},
    {"kill_uid", jail_kill_uid, METH_VARARGS,
     "kill_uid(uid)\n\nSIGKILL every process of uid (from a child that takes it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jail", "vfork + confine + exec: the C launcher of the landlock and bwrap backends.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jail(void) { return PyModule_Create(&module); }
