#!/bin/sh
# The broker of a hopbus stack: redis-server with redis.conf, and the ACL of users.acl with the
# hopbus user's password added, hashed (#sha256), so any password works and it is set in one
# place: the redis_password secret (/run/secrets/redis_password, or REDIS_PASSWORD_FILE) or
# REDIS_PASSWORD. compose/docker-compose.yml runs it:  sh /usr/local/etc/redis/start.sh
# (REDIS_ETC: another folder of these files; REDIS_MAXMEMORY: the memory bound, redis.conf's
# 1gb otherwise; arguments: more redis-server settings)
set -eu
here="${REDIS_ETC:-/usr/local/etc/redis}"  # where the broker/ files are
. "$here/password.sh"
hash=$(printf %s "$password" | sha256sum | cut -d' ' -f1)
acl=$(mktemp /tmp/users.acl.XXXXXX)
sed "s/^user hopbus .*/& #$hash/" "$here/users.acl" > "$acl"
grep -q "^user hopbus .*#$hash\$" "$acl" || { echo "start.sh: no 'user hopbus' line in users.acl" >&2; exit 2; }
set -- ${REDIS_MAXMEMORY:+--maxmemory "$REDIS_MAXMEMORY"} "$@"
exec redis-server "$here/redis.conf" --aclfile "$acl" "$@"  # "$@": more settings (tests)
