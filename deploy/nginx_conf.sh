#!/bin/sh
# Print deploy/nginx.conf for the replicas' ports and nginx's own:  deploy/nginx_conf.sh "8501 8502" 8080
# (replicas.sh renders it so, from PORTS and LISTEN, and the tests check the result with `nginx -t`).
# Relative paths in it (pid, logs, temporary files) sit under nginx's prefix: nginx -p DIR -c FILE.
set -eu
ports="${1:?give the replicas ports, e.g. \"8501 8502\"}"
listen="${2:-8080}"
for p in $ports $listen; do
    case "$p" in
        ''|*[!0-9]*) echo "nginx_conf.sh: '$p' is not a port number" >&2; exit 2 ;;
    esac
    if [ "$p" -lt 1 ] || [ "$p" -gt 65535 ]; then echo "nginx_conf.sh: port $p is out of range" >&2; exit 2; fi
done
awk -v ports="$ports" -v listen="$listen" '
    /^ *server 127\.0\.0\.1:[0-9]+;/ {
        if (!done) { n = split(ports, p, " "); for (i = 1; i <= n; i++) printf "        server 127.0.0.1:%s;\n", p[i]; done = 1 }
        next
    }
    /^ *listen [0-9]+;/ { sub(/[0-9]+/, listen) }
    { print }' "$(dirname "$0")/nginx.conf"
