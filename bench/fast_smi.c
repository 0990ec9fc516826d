/* A fast stand-in for the simulator's rbln-smi, for the Allocate benchmarks.

   It answers the simulator's four commands (-j, -g -j, group -c <gid> -a <npus>,
   group -d <gids>) with the same JSON and the same refusals, from files next to the
   binary (<binary>.d/, written by bench/fastsmi.py from the simulator's own listing):

     records  per device "<npu>\t<-j object>\t<-g -j object up to the group>\t<rest>", each
              record ended by \x1e (the objects span lines; JSON text holds no tab)
     head     the listing's text before the first device, tail the text after the last
     groups   the group id of each device, one per line (rewritten via rename)
     devroot  where group -c creates rsd<G> and group -d removes it
     timings  each call appends "<start ns> <end ns>" (CLOCK_MONOTONIC) from its own clock

   The timings are the tool's own cost from main() to its last write; what the exec itself
   costs the caller is measured separately (bench: the floor, spawning it from Python). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 1024

static char dir[4096];
static char *rec_j[MAX_DEVICES], *rec_g[MAX_DEVICES], *rec_rest[MAX_DEVICES];
static long npu[MAX_DEVICES], group[MAX_DEVICES];
static int count;
static struct timespec began;

static long long ns(const struct timespec *t) { return t->tv_sec * 1000000000LL + t->tv_nsec; }

static char *slurp(const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    ssize_t n;
    while ((n = read(fd, buf + len, cap - len)) > 0) {
        len += (size_t)n;
        if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
    }
    close(fd);
    buf[len] = 0;
    return buf;
}

static void stamp(void) {
    struct timespec ended;
    clock_gettime(CLOCK_MONOTONIC, &ended);
    char path[4200], line[64];
    snprintf(path, sizeof path, "%s/timings", dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        int n = snprintf(line, sizeof line, "%lld %lld\n", ns(&began), ns(&ended));
        if (write(fd, line, (size_t)n) < 0) { /* a lost timing shows as a missing line */ }
        close(fd);
    }
}

static int finish(int code) {
    fflush(stdout);
    fflush(stderr);
    stamp();
    return code;
}

static int refuse(int code, const char *message) {
    fprintf(stderr, "rbln-smi: %s\n", message);
    if (code == 2)
        fputs("usage: rbln-smi -j | rbln-smi -g -j | rbln-smi group -c <gid> -a <npu>[,<npu>...]"
              " | rbln-smi group -d <gid>[,<gid>...]\n", stderr);
    return finish(code);
}

static int load(void) {
    char *records = slurp("records"), *groups = slurp("groups");
    if (!records || !groups) return -1;
    char *save = NULL;
    for (char *line = strtok_r(records, "\x1e", &save); line && count < MAX_DEVICES;
         line = strtok_r(NULL, "\x1e", &save)) {
        char *fields[4];
        fields[0] = line;
        for (int i = 1; i < 4; i++) {
            fields[i] = strchr(fields[i - 1], '\t');
            if (!fields[i]) return -1;
            *fields[i]++ = 0;
        }
        npu[count] = strtol(fields[0], NULL, 10);
        rec_j[count] = fields[1];
        rec_g[count] = fields[2];
        rec_rest[count] = fields[3];
        count++;
    }
    char *cursor = groups;
    for (int i = 0; i < count; i++) group[i] = strtol(cursor, &cursor, 10);
    return 0;
}

static int save_groups(void) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/groups", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) return -1;
    for (int i = 0; i < count; i++) fprintf(out, "%ld\n", group[i]);
    if (fclose(out) != 0) return -1;
    return rename(tmp, path);
}

/* Comma-separated non-negative integers, no duplicates; -1 when malformed. */
static int int_list(const char *text, long *out, int max) {
    int n = 0;
    const char *p = text;
    if (!*p) return -1;
    while (*p) {
        if (*p < '0' || *p > '9' || n == max) return -1;
        char *end;
        out[n] = strtol(p, &end, 10);
        for (int i = 0; i < n; i++)
            if (out[i] == out[n]) return -1;
        n++;
        p = end;
        if (*p == ',') {
            p++;
            if (!*p) return -1;
        } else if (*p) {
            return -1;
        }
    }
    return n;
}

static int has_group(long gid) {
    for (int i = 0; i < count; i++)
        if (group[i] == gid) return 1;
    return 0;
}

static void touch_node(long gid, int create) {
    char *root = slurp("devroot"), path[4200];
    if (!root) return;
    root[strcspn(root, "\n")] = 0;
    snprintf(path, sizeof path, "%s/rsd%ld", root, gid);
    if (create) {
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) close(fd);
    } else {
        unlink(path);
    }
}

static void list(int with_groups) {
    char *head = slurp("head"), *tail = slurp("tail");
    fputs(head ? head : "", stdout);
    for (int i = 0; i < count; i++) {
        if (i) fputs(",\n", stdout);
        if (with_groups)
            printf("%s%ld%s", rec_g[i], group[i], rec_rest[i]);
        else
            fputs(rec_j[i], stdout);
    }
    fputs(tail ? tail : "", stdout);
}

/* The whole listing leaves in one write, as from the Go rbln-smi (its JSON is marshalled
   first, then printed): stdio's 4 KiB pipe buffer would cost the reader a wake-up per
   4 KiB that the real tool does not. */
static char out_buffer[1 << 20];

int main(int argc, char **argv) {
    clock_gettime(CLOCK_MONOTONIC, &began);
    setvbuf(stdout, out_buffer, _IOFBF, sizeof out_buffer);
    snprintf(dir, sizeof dir, "%s.d", argv[0]);
    int lock = -1;
    {
        char path[4200];
        snprintf(path, sizeof path, "%s/lock", dir);
        lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (lock < 0 || flock(lock, LOCK_EX) != 0) return refuse(3, "cannot access device state");
    }
    if (load() != 0) return refuse(3, "cannot access device state");
    if (argc == 2 && !strcmp(argv[1], "-j")) {
        list(0);
        return finish(0);
    }
    if (argc == 3 && ((!strcmp(argv[1], "-g") && !strcmp(argv[2], "-j")) ||
                      (!strcmp(argv[1], "-j") && !strcmp(argv[2], "-g")))) {
        list(1);
        return finish(0);
    }
    long ids[MAX_DEVICES], npus[MAX_DEVICES];
    char message[256];
    if (argc == 4 && !strcmp(argv[1], "group") && !strcmp(argv[2], "-d")) {
        int n = int_list(argv[3], ids, MAX_DEVICES);
        if (n < 0) return refuse(2, "invalid group id list");
        for (int i = 0; i < n; i++) {
            if (ids[i] == 0) return refuse(1, "group 0 is the default group and cannot be destroyed");
            if (!has_group(ids[i])) {
                snprintf(message, sizeof message, "group %ld does not exist", ids[i]);
                return refuse(1, message);
            }
        }
        for (int d = 0; d < count; d++)
            for (int i = 0; i < n; i++)
                if (group[d] == ids[i]) group[d] = 0;
        if (save_groups() != 0) return refuse(3, "cannot write device state");
        for (int i = 0; i < n; i++) touch_node(ids[i], 0);
        printf("Destroyed group(s) %s\n", argv[3]);
        return finish(0);
    }
    if (argc == 6 && !strcmp(argv[1], "group") && !strcmp(argv[2], "-c") && !strcmp(argv[4], "-a")) {
        if (int_list(argv[3], ids, 1) != 1) return refuse(2, "group -c takes one group id");
        int n = int_list(argv[5], npus, MAX_DEVICES);
        if (n < 0) return refuse(2, "invalid npu list");
        if (ids[0] == 0) return refuse(1, "group 0 is the default group and cannot be created");
        if (has_group(ids[0])) {
            snprintf(message, sizeof message, "group %ld already exists", ids[0]);
            return refuse(1, message);
        }
        int at[MAX_DEVICES];
        for (int i = 0; i < n; i++) {
            at[i] = -1;
            for (int d = 0; d < count; d++)
                if (npu[d] == npus[i]) at[i] = d;
            if (at[i] < 0) {
                snprintf(message, sizeof message, "npu %ld not found", npus[i]);
                return refuse(1, message);
            }
            if (group[at[i]] != 0) {
                snprintf(message, sizeof message, "npu %ld already belongs to group %ld",
                         npus[i], group[at[i]]);
                return refuse(1, message);
            }
        }
        for (int i = 0; i < n; i++) group[at[i]] = ids[0];
        if (save_groups() != 0) return refuse(3, "cannot write device state");
        touch_node(ids[0], 1);
        printf("Created group %ld (rsd%ld)\n", ids[0], ids[0]);
        return finish(0);
    }
    return refuse(2, "unknown arguments");
}
