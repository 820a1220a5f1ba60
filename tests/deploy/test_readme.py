"""The README tells a new user how to deploy: prerequisites, roles and what it costs when idle."""

from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_has_a_deploy_section_with_prerequisites_roles_and_idle_cost():
    section = README.split("## Deploy to your project", 1)[1].split("\n## ", 1)[0]
    for words in ("Prerequisites", "roles/run.admin", "roles/resourcemanager.projectIamAdmin", "tpuq deploy fleet.yaml --dry-run",
                  "gcloud builds submit --config cloudbuild.yaml", "estimates", "scale to zero", "$0.10 per job",
                  "TPU VMs", "janitor deletes"):
        assert words in section, words


def test_the_deploy_accounts_roles_in_the_readme_are_the_ones_iam_yaml_grants():
    import re

    import yaml

    from tpuq.deploy.infra import DEPLOY_SERVICE_ACCOUNT, INFRA_DIR

    section = README.split("### The Cloud Build account", 1)[1].split("\n### ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `roles/")]
    documented = {role for line in table for role in re.findall(r"`(roles/[\w.]+)`", line.split("|")[1])}
    bindings = yaml.safe_load((INFRA_DIR / "iam.yaml").read_text())["bindings"]
    granted = {b["role"] for b in bindings if b["member"] == f"sa:{DEPLOY_SERVICE_ACCOUNT}"}
    assert documented == granted
    assert "getDefaultServiceAccount" in section and "-compute@developer.gserviceaccount.com" in section


def test_readme_says_how_to_undeploy():
    section = README.split("### Removing tpuq: `tpuq undeploy`", 1)[1].split("\n## ", 1)[0]
    for words in ("--dry-run", "--purge", "--yes", "kept", "tpuq-owner"):
        assert words in section, words
