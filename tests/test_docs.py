"""The documentation site: its CLI reference generated from TuneParams, the whole site built in strict mode."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_field_as_a_flag_with_its_description():
    from prefect_hyperband.flows.params import TuneParams

    text = _hooks().cli_reference()
    for name, field in TuneParams.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert f"`{flag}`" in text, flag
        if name != "resume":  # the CLI's own spelling, --resume JOB, has its own help
            assert " ".join(field.description.split())[:40].replace("|", "\\|") in text, name


def test_a_field_without_a_description_fails_the_reference(monkeypatch):
    from pydantic.fields import FieldInfo

    from prefect_hyperband.flows.params import TuneParams

    monkeypatch.setitem(TuneParams.model_fields, "undocumented", FieldInfo(annotation=int, default=0))
    with pytest.raises(ValueError, match="without a description: undocumented"):
        _hooks().cli_reference()


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(tmp_path):
    """Broken links, missing pages and references that do not resolve fail the build."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--max-resource" in cli and "Several objectives: the champion" in cli
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "prefect_hyperband.app.api.tune" in api and "StopToken" in api
