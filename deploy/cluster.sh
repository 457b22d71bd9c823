#!/bin/sh
# The recipe's Dask cluster, listening on the private interface only, with TLS between machines.
#   PRIVATE_HOST=10.0.0.5 DASK_TLS_DIR=/etc/attnviz/dask-tls deploy/cluster.sh scheduler
#   PRIVATE_HOST=10.0.0.6 SCHEDULER_HOST=10.0.0.5 DASK_TLS_DIR=/etc/attnviz/dask-tls deploy/cluster.sh worker
#   PRIVATE_HOST       this host's address on the private network: every socket the scheduler, a worker or
#                      its nanny opens listens there and nowhere else (never 0.0.0.0)
#   SCHEDULER_HOST     (workers) the scheduler's private address; SCHEDULER_PORT (default 8786)
#   DASK_TLS_DIR       certificates from deploy/make_tls.sh: this role's pair and ca.pem. Required unless
#                      PRIVATE_HOST is 127.0.0.1 (a cluster on one machine). Anyone who can submit to a Dask
#                      scheduler runs code on its workers, so the scheduler accepts only peers that show a
#                      certificate signed by the recipe's CA.
#   NWORKERS           worker processes on this host (default 2, one thread each)
#   DASHBOARD_PORT     the scheduler's HTTP port (default 8787). Dask opens an HTTP server (health, metrics, and
#                      the dashboard when bokeh is installed) even with --no-dashboard, on every interface unless
#                      told otherwise: here the scheduler's and each worker's are bound to PRIVATE_HOST too.
set -eu
role="${1:?give scheduler or worker}"
: "${PRIVATE_HOST:?set PRIVATE_HOST to this host's private address (e.g. 10.0.0.5)}"
port="${SCHEDULER_PORT:-8786}"
dask="${DASK:-dask}"
case "$PRIVATE_HOST" in
    0.0.0.0|::|'[::]'|*' '*) echo "cluster.sh: PRIVATE_HOST must be one private address, not '$PRIVATE_HOST'" >&2; exit 2 ;;
esac
if [ -n "${DASK_TLS_DIR:-}" ]; then
    proto=tls
    set -- --tls-ca-file "$DASK_TLS_DIR/ca.pem" --tls-cert "$DASK_TLS_DIR/$role.pem" --tls-key "$DASK_TLS_DIR/$role-key.pem"
elif [ "$PRIVATE_HOST" = 127.0.0.1 ]; then
    proto=tcp
    set --
else
    echo "cluster.sh: a cluster across machines needs TLS: make certificates with deploy/make_tls.sh and set DASK_TLS_DIR" >&2
    exit 2
fi
case "$role" in
    scheduler)
        exec "$dask" scheduler --protocol "$proto" --host "$PRIVATE_HOST" --port "$port" \
            --dashboard-address "$PRIVATE_HOST:${DASHBOARD_PORT:-8787}" "$@" ;;
    worker)
        : "${SCHEDULER_HOST:?set SCHEDULER_HOST to the scheduler's private address}"
        exec "$dask" worker "$proto://$SCHEDULER_HOST:$port" --host "$PRIVATE_HOST" --nworkers "${NWORKERS:-2}" \
            --nthreads 1 --dashboard-address "$PRIVATE_HOST:0" "$@" ;;
    *) echo "cluster.sh: give scheduler or worker, not '$role'" >&2; exit 2 ;;
esac
