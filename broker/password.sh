# Sourced by start.sh and cli.sh: sets $password from the redis_password secret
# (REDIS_PASSWORD_FILE, default /run/secrets/redis_password where it exists) or REDIS_PASSWORD.
file="${REDIS_PASSWORD_FILE:-}"
if [ -z "$file" ] && [ -f /run/secrets/redis_password ]; then file=/run/secrets/redis_password; fi
if [ -n "$file" ]; then
  password=$(cat "$file")
else
  password="${REDIS_PASSWORD:-}"
fi
if [ -z "$password" ]; then
  echo "redis: no password: set REDIS_PASSWORD (compose/.env) or a redis_password secret" >&2
  exit 2
fi
