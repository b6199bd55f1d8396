#!/bin/sh
# redis-cli logged in as the hopbus user with the stack's password, inside the redis service:
#   docker compose -f compose/docker-compose.yml exec redis sh /usr/local/etc/redis/cli.sh \
#       GET hop:stack:run
set -eu
. /usr/local/etc/redis/password.sh
REDISCLI_AUTH="$password" exec redis-cli --user hopbus "$@"
