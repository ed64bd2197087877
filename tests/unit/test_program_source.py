"""core/program_source.py: a program sent to a host as source carries the core modules it
imports, and runs where nothing but the standard library is installed."""

from __future__ import annotations

import subprocess
import sys

import yaml

from core import link_rules
from core.program_source import carried_modules, program_source


def test_a_program_sent_as_source_carries_the_core_modules_it_imports(tmp_path):
    program = tmp_path / "probe.py"
    program.write_text(
        '"""A probe."""\n\nfrom __future__ import annotations\n\nimport json\n\n'
        "from core.ipfw_text import LINK_LINE, link_rate\n"
        "from core.link_rules import DUMMYNET_RIO_LABEL, MTU\n\n"
        'found = LINK_LINE.match("10001:   1.000 Mbit/s   25 ms burst 0")\n'
        "print(json.dumps([MTU, DUMMYNET_RIO_LABEL, link_rate(found), int(found[2])]))\n"
    )
    source = program_source(program)
    assert "def _carry_core_modules" in source
    # -I -S: nothing on the path but the standard library (not the current directory, not an
    # installed checkout), as on a rack host.
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", source], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout) == [
        link_rules.MTU,
        link_rules.DUMMYNET_RIO_LABEL,
        "1.000 Mbit/s",
        25,
    ]
    alone = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program.read_text()], cwd=tmp_path, capture_output=True
    )
    assert b"No module named 'core'" in alone.stderr


def test_the_modules_a_carried_module_imports_come_first():
    modules = carried_modules("from core.rio import virtual_queues\n")
    assert list(modules) == ["core.dscp", "core.link_rules", "core.units", "core.rio"]
