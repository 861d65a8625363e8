#!/usr/bin/env bash
# Installs everything Cascade needs on a fresh machine of this kind: Debian packages (Java for
# Spark and Kafka, Maven, Chromium for the UI test, PostgreSQL and Redis for the cluster
# profile, recorded speech: Tux Paint, Asterisk prompts, Fish Fillets), the Python virtual
# environment with the whole stack, the Apache Kafka broker's jars (Maven Central, each checked
# against infra/kafka/jars.sha256), the MovieLens-100k data package and emoji images (npm).
# Usage: bash infra/install.sh [VENV_DIR]   (called by `make venv`)
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  local missing=()
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
  # Maven fetches the Kafka broker's pinned jars (infra/kafka/pom.xml).
  command -v mvn >/dev/null || missing+=(maven)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/espeak-ng ] || missing+=(espeak-ng)
  # More synthetic voices for the speech corpus (jobs/speech_synth.py): flite, festival and
  # festival's two American English diphone voices.
  command -v flite >/dev/null || missing+=(flite)
  command -v text2wave >/dev/null || missing+=(festival)
  [ -d /usr/share/festival/voices/english/kal_diphone ] || missing+=(festvox-kallpc16k)
  [ -d /usr/share/festival/voices/english/ked_diphone ] || missing+=(festvox-kdlpc16k)
  # Human speech (spoken stamp descriptions) and captioned images.
  [ -d /usr/share/tuxpaint/stamps ] || missing+=(tuxpaint-stamps-default)
  # Recorded people with their text (jobs/speech_packages.py): English telephone prompts (the
  # text package and its WAVs) and the Czech and Dutch dialogue of Fish Fillets (the Lua scripts
  # and the Ogg clips). Their licences (CC-BY-SA, GPL) travel with the packages; nothing is
  # committed.
  [ -f /usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz ] || missing+=(asterisk-core-sounds-en)
  [ -d /usr/share/asterisk/sounds/en_US_f_Allison ] || missing+=(asterisk-core-sounds-en-wav)
  [ -d /usr/share/games/fillets-ng/script ] || missing+=(fillets-ng-data)
  [ -d /usr/share/games/fillets-ng/sound/airplane/cs ] || missing+=(fillets-ng-data-cs)
  [ -d /usr/share/games/fillets-ng/sound/airplane/nl ] || missing+=(fillets-ng-data-nl)
  command -v npm >/dev/null || missing+=(npm)
  # cairo, under cairosvg (SVG images in the image-text corpus).
  { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libcairo\.so\.2' || missing+=(libcairo2)
  # The cluster profile's data services: the stack runs its own PostgreSQL and Redis
  # (infra/stack.py), so the packages' system-wide services must not run (see below).
  local services=()
  compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || command -v postgres >/dev/null || services+=(postgresql)
  command -v redis-server >/dev/null || services+=(redis-server)
  missing+=("${services[@]}")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install: apt packages ${missing[*]}"
    # A policy-rc.d that refuses keeps the new packages' services from starting at install.
    local policy=/usr/sbin/policy-rc.d added=
    if [ ! -e "$policy" ]; then
      as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
      added=1
    fi
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    [ -z "$added" ] || as_root rm -f "$policy"
    # ... nor at the next boot on a host run by systemd.
    if [ ${#services[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
      for unit in "${services[@]}"; do as_root systemctl disable --now "$unit" 2>/dev/null || true; done
    fi
  fi
}
apt_install

if [ ! -x "$VENV/bin/python" ]; then
  echo "install: creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
# Every Python package comes from the lock (`make lock`, infra/lock.py): pinned, and pip refuses a
# file whose sha256 it does not list. --no-deps: the lock is the whole environment, and kserve 0.21
# (its psutil<6 pin clashes with Airflow's task SDK) and recbole (only its MovieLens data is read)
# are in it without their declared dependencies. torch is PyPI's build for linux x86_64 (CUDA-enabled,
# with its nvidia-* and triton packages, all pinned and hashed in the lock; it runs on the CPU).
LOCK=infra/requirements.lock
# The lock's entries (pinned line and its --hash lines) for the distributions named.
lock_entries() { awk -v names=" $* " '/^[^ #]/ { split($1, a, "=="); keep = index(names, " " a[1] " ") > 0 } keep' "$LOCK"; }
BOOT=$(mktemp)
trap 'rm -f "$BOOT"' EXIT
lock_entries pip setuptools >"$BOOT"
# pip and setuptools first: the venv's bundled pip runs only this step, and the locked setuptools
# builds the lock's few sdists in the venv (--no-build-isolation), so no unhashed build tool is fetched.
"$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r "$BOOT"
echo "install: $(grep -c '^[^ #]' "$LOCK") locked packages from $LOCK (torch with its CUDA libraries: ~3 GB to download once)"
"$PIP" install -q --require-hashes --no-deps --no-build-isolation -r "$LOCK"
# The project itself, editable; its dependencies are all in the lock.
"$PIP" install -q --no-deps --no-build-isolation -e .
# DeepSpeed builds its CPU communication extension on first use: built here once, into the caches
# the launches and in-process groups use, rather than inside the first test or training step.
"$VENV/bin/python" -c "from cascade.training.launch import prebuild_extensions as p; p()"
# Apache Kafka from Maven Central at the pinned versions; every jar checked against its digest.
"$VENV/bin/python" -m infra.kafka_broker install "$VENV"
# MovieLens-100k ships inside recbole (in the lock); only its data is used.
"$VENV/bin/python" -c "import importlib.util as u; from pathlib import Path; p=Path(u.find_spec('recbole').submodule_search_locations[0])/'dataset_example/ml-100k/ml-100k.inter'; assert p.exists(), p"
# Emoji images with their names (npm, PNG + emoji.json): image-text pairs for the multimodal corpus.
EMOJI="$VENV/npm/node_modules/emoji-datasource-google"
if [ ! -f "$EMOJI/emoji.json" ]; then
  echo "install: npm emoji-datasource-google into $VENV/npm"
  # --ignore-scripts: a data package has no business running install hooks.
  npm install --silent --no-audit --no-fund --ignore-scripts --prefix "$VENV/npm" emoji-datasource-google@16.0.0
fi
# Any `airflow ...` or `python -m airflow ...` run from this venv talks to the project's Airflow
# (home under the state folder, DAGs from dags/) unless AIRFLOW_HOME is set explicitly.
REPO=$(pwd)
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cat > "$SITE/cascade_airflow_home.pth" <<PTH
import os; _h = os.environ.get("CASCADE_HOME", "$REPO/.cascade"); os.environ.setdefault("AIRFLOW_HOME", _h + "/airflow"); os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", "$REPO/dags"); os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
PTH
echo "install: done ($("$VENV/bin/python" -c 'import torch, airflow, pyspark; print("torch", torch.__version__, "airflow", airflow.__version__, "pyspark", pyspark.__version__)'))"
