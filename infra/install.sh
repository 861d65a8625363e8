#!/usr/bin/env bash
# Installs everything Cascade needs on a fresh machine of this kind: Debian packages (Java for
# Spark, Chromium for the UI test), the Python virtual environment with the whole stack, the
# Kafka-protocol broker (a PyPI wheel), the MovieLens-100k data package and emoji images (npm).
# Usage: bash infra/install.sh [VENV_DIR]   (called by `make venv`)
set -euo pipefail
VENV=${1:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

apt_install() {
  local missing=()
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/espeak-ng ] || missing+=(espeak-ng)
  # Human speech (spoken stamp descriptions) and captioned images.
  [ -d /usr/share/tuxpaint/stamps ] || missing+=(tuxpaint-stamps-default)
  command -v npm >/dev/null || missing+=(npm)
  # cairo, under cairosvg (SVG images in the image-text corpus).
  { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libcairo\.so\.2' || missing+=(libcairo2)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install: apt packages ${missing[*]}"
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
      sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
  fi
}
apt_install

if [ ! -x "$VENV/bin/python" ]; then
  echo "install: creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
PIP="$VENV/bin/pip"
# torch first and pinned: an unpinned torch pulled in by another package is a multi-GB CUDA build.
"$PIP" install -q torch==2.13.0
# The broker's native binary only from the wheel with the pinned sha256.
"$PIP" install -q --no-deps --require-hashes -r infra/broker-requirements.txt
"$PIP" install -q -e '.[dev]'
# kserve 0.21 pins psutil<6, which Airflow's task SDK cannot use; its other needs are in pyproject.
"$PIP" install -q --no-deps kserve==0.21.0
# MovieLens-100k ships inside recbole; only its data is used, so none of its dependencies.
"$PIP" install -q --no-deps recbole==1.2.1
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
