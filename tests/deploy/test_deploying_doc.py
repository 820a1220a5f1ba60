"""docs/DEPLOYING.md tells a new user how to deploy: prerequisites, roles, what it costs when idle, how to undeploy;
and the README gives the deploy commands and links there."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOYING = (REPO / "docs" / "DEPLOYING.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of the same or a higher level (a `#` in a code block is none)."""
    level = len(heading.split(" ", 1)[0])
    lines, in_code = [], False
    for line in text.split(f"\n{heading}\n", 1)[1].splitlines():
        in_code ^= line.startswith("```")
        if not in_code and re.match(rf"#{{1,{level}}} ", line):
            break
        lines.append(line)
    return "\n".join(lines)


def test_deploying_doc_has_prerequisites_roles_and_idle_cost():
    for words in ("Prerequisites", "roles/run.admin", "roles/resourcemanager.projectIamAdmin", "tpuq deploy fleet.yaml --dry-run",
                  "gcloud builds submit --config cloudbuild.yaml", "estimates", "scale to zero", "$0.10 per job",
                  "TPU VMs", "janitor deletes"):
        assert words in DEPLOYING, words
    cost = section(DEPLOYING, "## What it costs when idle")
    for words in ("estimates", "scale to zero", "$0.10 per job", "TPU VMs", "janitor deletes"):
        assert words in cost, words


def test_the_deploy_accounts_roles_in_the_deploying_doc_are_the_ones_iam_yaml_grants():
    import yaml

    from tpuq.deploy.infra import DEPLOY_SERVICE_ACCOUNT, INFRA_DIR

    text = section(DEPLOYING, "## The Cloud Build account")
    table = [line for line in text.splitlines() if line.startswith("| `roles/")]
    documented = {role for line in table for role in re.findall(r"`(roles/[\w.]+)`", line.split("|")[1])}
    bindings = yaml.safe_load((INFRA_DIR / "iam.yaml").read_text())["bindings"]
    granted = {b["role"] for b in bindings if b["member"] == f"sa:{DEPLOY_SERVICE_ACCOUNT}"}
    assert documented == granted
    assert "getDefaultServiceAccount" in text and "-compute@developer.gserviceaccount.com" in text


def test_deploying_doc_says_how_to_undeploy():
    text = section(DEPLOYING, "## Removing tpuq: `tpuq undeploy`")
    for words in ("--dry-run", "--purge", "--yes", "kept", "tpuq-owner"):
        assert words in text, words


def test_readme_gives_the_deploy_commands_and_links_the_deploying_doc():
    readme = (REPO / "README.md").read_text()
    text = section(readme, "## Deploying to your project")
    for words in ("tpuq deploy fleet.yaml --dry-run", "tpuq deploy fleet.yaml --skip-services",
                  "gcloud builds submit --config cloudbuild.yaml", "(docs/DEPLOYING.md)"):
        assert words in text, words
