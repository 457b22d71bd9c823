#!/bin/sh
# Certificates for the recipe's Dask cluster (TLS, mutual: each side shows a certificate signed by this CA):
#   deploy/make_tls.sh DIR      writes DIR/ca.pem, and scheduler / worker / client .pem with their -key.pem
# Copy ca.pem plus the scheduler's, each worker's and the replicas' (client) pair to those hosts only; keep
# DIR/ca-key.pem offline: whoever holds it can make a certificate the cluster accepts, i.e. run code on it.
set -eu
dir="${1:?give the folder for the certificates, e.g. /etc/attnviz/dask-tls}"
days="${DAYS:-825}"
umask 077
mkdir -p "$dir"
openssl req -x509 -newkey rsa:3072 -nodes -days "$days" -subj "/CN=attnviz Dask CA" \
    -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' \
    > "$dir/leaf.ext"
for role in scheduler worker client; do
    openssl req -newkey rsa:3072 -nodes -subj "/CN=attnviz Dask $role" \
        -keyout "$dir/$role-key.pem" -out "$dir/$role.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$role.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
        -days "$days" -extfile "$dir/leaf.ext" -out "$dir/$role.pem" 2>/dev/null
    rm -f "$dir/$role.csr"
done
rm -f "$dir/leaf.ext" "$dir/ca.srl"
echo "made $dir: ca.pem, scheduler/worker/client .pem and -key.pem (keep ca-key.pem offline)" >&2
