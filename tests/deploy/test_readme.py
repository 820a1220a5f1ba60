"""The README tells a new user how to deploy: prerequisites, roles and what it costs when idle."""

from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_has_a_deploy_section_with_prerequisites_roles_and_idle_cost():
    section = README.split("## Deploy to your project", 1)[1].split("\n## ", 1)[0]
    for words in ("Prerequisites", "roles/run.admin", "roles/resourcemanager.projectIamAdmin", "tpuq deploy fleet.yaml --dry-run",
                  "gcloud builds submit --config cloudbuild.yaml", "estimates", "scale to zero", "$0.10 per job",
                  "TPU VMs", "janitor deletes"):
        assert words in section, words
