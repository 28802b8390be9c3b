#!/bin/sh
# Create the RLHFless bucket, its least-privilege policies and the two identities on MinIO.
#
# Needs the MinIO client `mc` (https://github.com/minio/mc; image minio/mc). Idempotent: safe
# to run again (it updates the policies and re-attaches them).
#
#   MINIO_ENDPOINT           http://minio:9000
#   MINIO_ROOT_USER / MINIO_ROOT_PASSWORD   admin credentials (used here only)
#   RLHFLESS_BUCKET          bucket name                       (default rlhfless)
#   RLHFLESS_PREFIX          key prefix the identities may use (default runs)
#   RLHFLESS_ACTIONS_USER / RLHFLESS_ACTIONS_SECRET   identity bound to OpenWhisk actions
#   RLHFLESS_FLOWS_USER / RLHFLESS_FLOWS_SECRET       identity of the Prefect flows (may delete)
#
# Store URI afterwards: s3://$RLHFLESS_BUCKET/$RLHFLESS_PREFIX/<campaign>
# Secrets are passed to `mc` on its command line: run this in a one-shot container or job,
# not on a shared host.
set -eu

: "${MINIO_ENDPOINT:=http://localhost:9000}"
: "${MINIO_ROOT_USER:?set MINIO_ROOT_USER}"
: "${MINIO_ROOT_PASSWORD:?set MINIO_ROOT_PASSWORD}"
: "${RLHFLESS_BUCKET:=rlhfless}"
: "${RLHFLESS_PREFIX:=runs}"
: "${RLHFLESS_ACTIONS_USER:=rlhfless-actions}"
: "${RLHFLESS_ACTIONS_SECRET:?set RLHFLESS_ACTIONS_SECRET (8+ characters)}"
: "${RLHFLESS_FLOWS_USER:=rlhfless-flows}"
: "${RLHFLESS_FLOWS_SECRET:?set RLHFLESS_FLOWS_SECRET (8+ characters)}"

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
alias_name=rlhfless-setup

# Wait for the server (bounded: 60 tries, 2 s apart).
tries=0
until mc alias set "$alias_name" "$MINIO_ENDPOINT" "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
        echo "setup: cannot reach MinIO at $MINIO_ENDPOINT or the root credentials are wrong" >&2
        exit 1
    fi
    sleep 2
done

mc mb --ignore-existing "$alias_name/$RLHFLESS_BUCKET"
# Abort multipart uploads left by crashed writers (MinIO also expires them on its own).
mc ilm import "$alias_name/$RLHFLESS_BUCKET" < "$here/lifecycle.json" || \
    echo "setup: could not import lifecycle.json (older mc?); continuing" >&2

render() {  # policy template -> concrete policy for this bucket and prefix
    sed -e "s|RLHFLESS_BUCKET|$RLHFLESS_BUCKET|g" -e "s|RLHFLESS_PREFIX|$RLHFLESS_PREFIX|g" \
        "$here/$1" > "$work/$1"
}
render policy-actions.json
render policy-flows.json
mc admin policy create "$alias_name" rlhfless-actions "$work/policy-actions.json"
mc admin policy create "$alias_name" rlhfless-flows "$work/policy-flows.json"

mc admin user add "$alias_name" "$RLHFLESS_ACTIONS_USER" "$RLHFLESS_ACTIONS_SECRET"
mc admin user add "$alias_name" "$RLHFLESS_FLOWS_USER" "$RLHFLESS_FLOWS_SECRET"
# attach fails if the policy is already attached; that is the state we want
mc admin policy attach "$alias_name" rlhfless-actions --user "$RLHFLESS_ACTIONS_USER" 2>/dev/null || true
mc admin policy attach "$alias_name" rlhfless-flows --user "$RLHFLESS_FLOWS_USER" 2>/dev/null || true

mc alias remove "$alias_name" >/dev/null
echo "setup: bucket $RLHFLESS_BUCKET ready; store.uri = s3://$RLHFLESS_BUCKET/$RLHFLESS_PREFIX/<campaign>"
