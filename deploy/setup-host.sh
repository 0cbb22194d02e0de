#!/usr/bin/env bash
# Prepare a Debian 12 host for Sandhive, idempotently: Docker engine, PostgreSQL and
# Redis installed and running, the virtualenv, the `sandhive` database migrated and
# the sandbox image built (its base from Debian packages, so no registry is needed).
# Used by the README's quick start and by CI; skips whatever is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
pg_installed=0  # 1: this run installs PostgreSQL, so its fresh pg_hba.conf is ours to adjust
command -v pg_ctlcluster >/dev/null || { need_pkgs+=(postgresql); pg_installed=1; }
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
# The egress sandboxes' firewall (iptables-restore) and the network tests (ss, ip).
command -v iptables-restore >/dev/null || need_pkgs+=(iptables)
command -v ss >/dev/null || need_pkgs+=(iproute2)
# Headless browser for the page's browser test (driven by Playwright; never `playwright install`).
command -v chromium >/dev/null || need_pkgs+=(chromium)
command -v docker-compose >/dev/null || need_pkgs+=(docker-compose)
# A lighter OCI runtime for the sandboxes (SANDHIVE_SANDBOX_RUNTIME=crun, docs/performance.md).
command -v crun >/dev/null || need_pkgs+=(crun)  # the compose e2e test (tests/e2e/test_compose.py)
if ((${#need_pkgs[@]})); then
    log "installing ${need_pkgs[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# Debian's fresh pg_hba.conf wants a password (scram-sha-256) on 127.0.0.1 and ::1, but the
# psql below and the default SANDHIVE_DATABASE_URL (postgresql+asyncpg://postgres@127.0.0.1:5432/
# sandhive) carry none. So, only for a PostgreSQL this run installed, trust the `postgres` role on
# loopback (first match wins, hence prepended), as on the CI machines. A PostgreSQL that was
# already here keeps its own rules; the marker keeps a re-run from adding the lines twice.
pg_hba_marker="# added by sandhive deploy/setup-host.sh on a fresh install"
pg_hba_changed=0
if ((pg_installed)); then
    for hba in /etc/postgresql/*/main/pg_hba.conf; do
        [ -f "$hba" ] && ! grep -qF "$pg_hba_marker" "$hba" || continue
        log "trusting the postgres role on loopback in $hba"
        {
            printf 'host all postgres 127.0.0.1/32 trust  %s\n' "$pg_hba_marker"
            printf 'host all postgres ::1/128 trust  %s\n' "$pg_hba_marker"
            cat "$hba"
        } >"$hba.sandhive-new"
        cat "$hba.sandhive-new" >"$hba" # in place: keeps the file's owner and mode
        rm -f "$hba.sandhive-new"
        pg_hba_changed=1
    done
fi

# A cgroup v1 "hybrid" host (cgroup2 at /sys/fs/cgroup/unified) may leave a controller that
# no v1 hierarchy took (hugetlb on these VMs) on the unified hierarchy; crun then refuses every
# container ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"). A
# controller nobody enabled there (empty cgroup.subtree_control) moves to a v1 hierarchy of its
# own by mounting one, as systemd would have done; runc is indifferent to where it sits.
# This changes the host's cgroup mounts (until its next boot), for every user of the host.
unified=/sys/fs/cgroup/unified
if [ "$(stat -f -c %T /sys/fs/cgroup)" = tmpfs ] && [ -r "$unified/cgroup.controllers" ] \
    && [ -n "$(cat "$unified/cgroup.controllers")" ]; then
    if [ -n "$(cat "$unified/cgroup.subtree_control")" ]; then
        echo "cgroup controllers in use on $unified: crun will refuse containers here" >&2
    else
        for controller in $(cat "$unified/cgroup.controllers"); do
            log "moving the $controller cgroup controller to a v1 hierarchy (for crun)"
            { mkdir -p "/sys/fs/cgroup/$controller" \
                && mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller"; } \
                || echo "could not move $controller: crun will refuse containers here" >&2
        done
    fi
fi

if ! docker info >/dev/null 2>&1; then
    log "starting dockerd"
    # A daemon killed earlier (e.g. at the end of a session) leaves its pid files behind.
    for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
        if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then rm -f "$pidfile"; fi
    done
    (dockerd >/var/log/dockerd.log 2>&1 &)
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { cat /var/log/dockerd.log; exit 1; }
fi

# Register crun with dockerd (merged into daemon.json, other keys kept). Only when the file
# changed is the daemon told: SIGHUP reloads `runtimes` without stopping any container.
daemon_json=/etc/docker/daemon.json
if python3 - "$daemon_json" "$(command -v crun)" <<'PY'
import json, os, sys
path, crun = sys.argv[1], sys.argv[2]
conf = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
if conf.get("runtimes", {}).get("crun", {}).get("path") == crun:
    sys.exit(1)  # already registered: nothing to do
conf.setdefault("runtimes", {})["crun"] = {"path": crun}
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".sandhive-new", "w") as out:
    json.dump(conf, out, indent=2)
os.replace(path + ".sandhive-new", path)
PY
then
    log "registered crun in $daemon_json; reloading dockerd"
    kill -HUP "$(cat /var/run/docker.pid)"  # this host's default daemon, not any other
    for _ in $(seq 1 20); do docker info --format '{{json .Runtimes}}' | grep -q '"crun"' && break; sleep 0.5; done
    docker info --format '{{json .Runtimes}}' | grep -q '"crun"' || { echo "dockerd did not load crun" >&2; exit 1; }
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
elif ((pg_hba_changed)); then
    log "reloading PostgreSQL (pg_hba.conf)"  # the package's install started it with the old rules
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main reload
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    log "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
    for _ in $(seq 1 30); do redis-cli ping >/dev/null 2>&1 && break; sleep 1; done
fi

log "virtualenv"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -U pip
.venv/bin/pip install -q -e '.[dev,inspect,e2b,rl]' 'inspect-ai==0.3.285' 'standardwebhooks==1.3.0' 'svix==2.9.1' \
    'openapi-python-client==0.29.1' \
    -e clients/python  # the Python client, for docs/calling-services.md; inspect-ai pinned as tested
make reference-package  # the paper's package beside it, for the listing-order test (2 MB, no litellm)

log "sandbox image (offline base from Debian packages)"
.venv/bin/sandhive image build --offline

log "database"
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='sandhive'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE sandhive"
.venv/bin/sandhive migrate

# API keys are on by default (SANDHIVE_AUTH=keys): say how to get one.
echo
# $USER is unset in containers and CI shells: name the tenant after the account instead.
tenant="${USER:-$(id -un 2>/dev/null || echo local)}"
echo "Create an API key for the API (printed once):  .venv/bin/sandhive keys create --tenant $tenant"
echo "then call it with:  curl -H \"Authorization: Bearer <key>\" localhost:8000/v1/tasks"
