/* A native backtrace of the thread that receives the signal (gemm_drain.py --backtrace).
 * Build: cc -O1 -shared -fPIC -o gemm_drain_bt.so gemm_drain_bt.c
 * bt_install(sig, path): handler for sig; each delivery appends "== call K sample S" and
 * the frames (glibc backtrace_symbols_fd: library, nearest exported symbol, offset). */
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int g_fd = -1;
static volatile long g_call = -1, g_sample = -1;

void bt_mark(long call, long sample) { g_call = call; g_sample = sample; }

static void on_signal(int sig, siginfo_t *info, void *ctx) {
    (void)sig; (void)info; (void)ctx;
    void *frames[96];
    char head[64];
    int n = backtrace(frames, 96);
    int k = snprintf(head, sizeof head, "== call %ld sample %ld\n", g_call, g_sample);
    if (g_fd >= 0) {
        if (k > 0) (void)!write(g_fd, head, (size_t)k);
        backtrace_symbols_fd(frames, n, g_fd);
    }
}

int bt_install(int sig, const char *path) {
    void *warm[4];
    backtrace(warm, 4); /* loads the unwinder outside the handler */
    g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (g_fd < 0) return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}
