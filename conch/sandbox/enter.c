/* conch-enter: run a command inside a running local sandbox, with the capabilities of a Docker container.
 *
 * usage: conch-enter PID -- PROGRAM [ARG...]
 *        conch-enter --new-userns -- PROGRAM [ARG...]
 *        conch-enter --seal PID
 *
 * Joins every namespace of PID (user first, then cgroup, ipc, uts, net, pid, mnt), takes PID's root as its
 * own, forks (a pid namespace applies to children), and in the child drops every capability outside Docker's
 * default set from the bounding, inheritable, ambient, permitted and effective sets, sets no_new_privs, then
 * execs PROGRAM from the box's filesystem. The parent waits and exits as the child did (same code, or the
 * same signal), like nsenter.
 *
 * --new-userns (how a box is launched): unshare a user namespace, wait for one line on stdin (the host writes
 * the uid/gid maps, then sends it; EOF exits 97), become the namespace's root (host uid ID_BASE) and exec
 * PROGRAM with a full capability set in the namespace only. `unshare --user` cannot do this: it execs while
 * still host uid 0, which is not root in a namespace whose root is mapped elsewhere, so the exec drops every
 * capability; util-linux's own mapping needs newuidmap and /etc/subuid.
 *
 * --seal (once, right after a box starts, before anything else runs in it): bind /proc/sys, /proc/sysrq-trigger,
 * /proc/irq and /proc/bus read-only over themselves in the box's mount namespace. bubblewrap covers these only
 * where access(W_OK) succeeds, which a directory such as /proc/sys (mode 555) never does, so its files stayed
 * writable. Done here by mount(2), not by a program from the box's (task-controlled) filesystem.
 *
 * Why not nsenter: joining a user namespace gives the joiner every capability in it (the kernel resets the
 * bounding set on setns), so commands entered with nsenter held CAP_SYS_ADMIN over the box's mounts and could
 * remount /sys or /proc/sys read-write. Nothing in the box runs before the drop, and this binary lives on the
 * host, out of the box's reach.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

/* Docker's default capability set (moby oci/caps/defaults.go). */
static const int KEEP[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FSETID, CAP_FOWNER, CAP_MKNOD, CAP_NET_RAW,
                           CAP_SETGID, CAP_SETUID, CAP_SETFCAP, CAP_SETPCAP, CAP_NET_BIND_SERVICE,
                           CAP_SYS_CHROOT, CAP_KILL, CAP_AUDIT_WRITE};

static void die(const char *what) {
    fprintf(stderr, "conch-enter: %s: %s\n", what, strerror(errno));
    exit(126);
}

static int kept(int cap) {
    for (size_t i = 0; i < sizeof KEEP / sizeof KEEP[0]; i++)
        if (KEEP[i] == cap) return 1;
    return 0;
}

static void drop_capabilities(void) {
    int last = 63;
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "r");
    if (f) {
        if (fscanf(f, "%d", &last) != 1) last = 63;
        fclose(f);
    }
    for (int cap = 0; cap <= last; cap++)
        if (!kept(cap) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) die("drop bounding set");
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    for (size_t i = 0; i < sizeof KEEP / sizeof KEEP[0]; i++) {
        data[KEEP[i] / 32].effective |= 1u << (KEEP[i] % 32);
        data[KEEP[i] / 32].permitted |= 1u << (KEEP[i] % 32);
    }
    if (syscall(SYS_capset, &hdr, data) != 0) die("capset");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs");
}

static void become_namespace_root(void) {
    if (setgroups(0, NULL) != 0) die("setgroups");
    if (setresgid(0, 0, 0) != 0) die("setresgid");
    if (setresuid(0, 0, 0) != 0) die("setresuid");
}

static int seal_proc(void) {
    static const char *const COVER[] = {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"};
    for (size_t i = 0; i < sizeof COVER / sizeof COVER[0]; i++) {
        if (access(COVER[i], F_OK) != 0) continue;
        if (mount(COVER[i], COVER[i], NULL, MS_BIND | MS_REC, NULL) != 0) die(COVER[i]);
        if (mount(NULL, COVER[i], NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  NULL) != 0)
            die(COVER[i]);
    }
    return 0;
}

static int new_userns(char **argv) {
    if (unshare(CLONE_NEWUSER) != 0) die("unshare user namespace");
    char c;
    ssize_t n;
    do {  /* one byte at a time: what follows the line is the box's own stdin */
        n = read(0, &c, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 97;
    } while (c != '\n');
    become_namespace_root();
    execvp(argv[0], argv);
    fprintf(stderr, "conch-enter: %s: %s\n", argv[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--new-userns") == 0 && strcmp(argv[2], "--") == 0)
        return new_userns(argv + 3);
    int seal = argc == 3 && strcmp(argv[1], "--seal") == 0;
    if (seal) argv++;
    else if (argc < 4 || strcmp(argv[2], "--") != 0) {
        fprintf(stderr, "usage: conch-enter PID -- PROGRAM [ARG...] | --new-userns -- PROGRAM [ARG...] | --seal PID\n");
        return 2;
    }
    static const char *const NS[] = {"user", "cgroup", "ipc", "uts", "net", "pid", "mnt"};
    int fds[7], root;
    char path[64];
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "/proc/%s/ns/%s", argv[1], NS[i]);
        if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) die(path);
    }
    snprintf(path, sizeof path, "/proc/%s/root", argv[1]);
    if ((root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) die(path);
    for (int i = 0; i < 7; i++) {
        if (setns(fds[i], 0) != 0) die(NS[i]);
        close(fds[i]);
    }
    if (fchdir(root) != 0 || chroot(".") != 0 || chdir("/") != 0) die("chroot");
    close(root);

    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        become_namespace_root();
        if (seal) _exit(seal_proc());
        drop_capabilities();
        execvp(argv[3], argv + 3);
        fprintf(stderr, "conch-enter: %s: %s\n", argv[3], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        raise(WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    return WEXITSTATUS(status);
}
