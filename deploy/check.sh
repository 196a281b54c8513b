#!/usr/bin/env bash
# Offline checks of the deploy files. Needs python3 with PyYAML (Debian:
# python3-yaml); runs the deeper checks whose programs are installed and says
# which it skipped:
#   kubernetes-validate  (pip)  Kubernetes schemas, strict
#   check-jsonschema     (pip)  GitHub Actions and GitLab CI schemas
#   systemd-analyze             the systemd unit
# Exit 0 when every check that ran passed.
set -euo pipefail
cd "$(dirname "$0")"

fail=0
python3 - <<'PY' || fail=1
import glob, sys
try:
    import yaml
except ImportError:
    sys.exit("deploy/check.sh: PyYAML is missing (apt-get install python3-yaml)")
bad = 0
for path in sorted(glob.glob("k8s/*.yaml") + glob.glob("ci/*.yml")):
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        assert docs, "no YAML document"
        print(f"yaml ok: {path} ({len(docs)} document(s))")
    except Exception as e:
        print(f"yaml FAILED: {path}: {e}")
        bad = 1
sys.exit(bad)
PY

if command -v kubernetes-validate >/dev/null; then
  for v in 1.27.0 1.30.0; do
    kubernetes-validate -k "$v" --strict --quiet k8s/deployment.yaml k8s/service.yaml k8s/pdb.yaml \
      && echo "kubernetes-validate $v: ok" || fail=1
  done
else
  echo "skipped: kubernetes-validate (pip install kubernetes-validate)"
fi

if command -v check-jsonschema >/dev/null; then
  check-jsonschema --builtin-schema vendor.github-workflows ci/github-precision-gate.yml || fail=1
  check-jsonschema --builtin-schema vendor.github-workflows ci/github-kernel-check.yml || fail=1
  check-jsonschema --builtin-schema vendor.gitlab-ci ci/gitlab-ci.yml || fail=1
  check-jsonschema --builtin-schema vendor.gitlab-ci ci/gitlab-kernel-check.yml || fail=1
else
  echo "skipped: check-jsonschema (pip install check-jsonschema)"
fi

if command -v systemd-analyze >/dev/null; then
  # The unit names /opt/logitd/bin/logitd, which need not be installed here:
  # verify a copy that runs /bin/true instead.
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  sed 's#^ExecStart=/opt/logitd/bin/logitd#ExecStart=/bin/true#' systemd/logitd.service \
    > "$tmp/logitd.service"
  out="$(systemd-analyze verify "$tmp/logitd.service" 2>&1)" || fail=1
  if [ -n "$out" ]; then echo "$out"; fail=1; else echo "systemd-analyze verify: ok"; fi
else
  echo "skipped: systemd-analyze"
fi

if [ "$fail" -ne 0 ]; then echo "deploy/check.sh: FAILED"; exit 1; fi
echo "deploy/check.sh: all checks that ran passed"
