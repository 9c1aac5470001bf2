/* A C engine in an isolated container: registers through a reaper's
 * listener (argv[1], token from LIVEREG_TOKEN, for tls:// the CA file from
 * LIVEREG_TLS_CA and a client certificate and key from LIVEREG_TLS_CERT and
 * LIVEREG_TLS_KEY), says "registered", pings every 10 ms, and says
 * "evicted REASON" when a ping is refused. */
#include <livereg.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    livereg_connect_options opts;
    livereg_worker *worker = NULL;
    livereg_result r;
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDRESS INSTANCE_ID\n", argv[0]);
        return 2;
    }
    livereg_connect_options_default(&opts);
    opts.token = getenv("LIVEREG_TOKEN");
    opts.tls_ca_file = getenv("LIVEREG_TLS_CA");
    opts.tls_cert_file = getenv("LIVEREG_TLS_CERT");
    opts.tls_key_file = getenv("LIVEREG_TLS_KEY");
    r = livereg_connect(argv[1], &opts, strtoull(argv[2], NULL, 10), "c-engine", &worker);
    if (r != LIVEREG_OK) {
        printf("refused %s: %s\n", livereg_result_str(r), livereg_last_error());
        return 1;
    }
    printf("registered\n");
    fflush(stdout);
    for (;;) {
        r = livereg_ping(worker);
        if (r != LIVEREG_OK) {
            printf("evicted %s\n", livereg_result_str(r));
            fflush(stdout);
            livereg_deregister(worker);
            return 0;
        }
        usleep(10000);
    }
}
