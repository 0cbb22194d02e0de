#!/bin/sh
# First start: initdb with the password from POSTGRES_PASSWORD, create POSTGRES_DB. Then serve.
set -eu
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -A scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$db" != "postgres" ]; then
        PGPASSWORD="$POSTGRES_PASSWORD" createdb -h /var/run/postgresql -U "$user" "$db"
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
