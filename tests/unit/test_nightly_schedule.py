"""What an installed nightly schedule runs is what `make batch` runs with the same SET: from
`make nightly-install` (its --make-vars) through the schedule's script to `make nightly-run`'s
`--set` items, with the characters cron and systemd treat specially (%, $, quotes, brackets)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import trials.__main__ as cli
from trials import nightly

PROJECT = Path(__file__).resolve().parents[2]
EXPERIMENT = "experiments/web_poisson.yml"
# As typed after SET= on make's command line ($$: make's own escape for a literal $).
ITEMS = [
    "duration=60s",
    "factors.hosts.all.cc=[reno,cubic]",
    "hosts.all.cc_params={}",
    "traffic[web1].load=20%",
    "description=it's",
    'x=a"b',
    "y=$$HOME",
]
EXPECTED = [item.replace("$$", "$") for item in ITEMS]


def make_dry(*args: str) -> str:
    """The recipe `make -n` prints, its continued lines joined as the shell joins them."""
    done = subprocess.run(
        ["make", "-s", "-n", *args], cwd=PROJECT, capture_output=True, text=True, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.replace("\\\n", " ").splitlines() if "bin/trialbed " in x]
    return line


def option_values(line: str, option: str) -> list[str]:
    argv = shlex.split(line)
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == option]


@pytest.mark.parametrize("systemd", [False, True], ids=["cron", "systemd"])
def test_the_schedule_runs_the_nightly_batch_with_every_set_item_intact(
    tmp_path, monkeypatch, capsys, systemd
):
    sets = f"SET={' '.join(ITEMS)}"
    assert option_values(make_dry("batch", f"EXPERIMENT={EXPERIMENT}", sets), "--set") == EXPECTED
    (make_vars,) = option_values(
        make_dry("nightly-install", f"EXPERIMENT={EXPERIMENT}", sets), "--make-vars"
    )
    # Install into this test's directories; what systemctl or cron would do is not run.
    for name in ("UNIT_DIR", "CRON_DIR", "SCRIPT_DIR", "NIGHTLY_DIR"):
        monkeypatch.setattr(nightly, name, tmp_path / name)
        (tmp_path / name).mkdir()
    monkeypatch.setattr(nightly, "uses_systemd", lambda: systemd)
    monkeypatch.setattr(nightly, "ensure_cron", lambda: None)
    real_run = subprocess.run
    systemctl = []

    def run(argv, **kwargs):  # subprocess.run itself: systemctl is only recorded
        if argv[0] == "systemctl":
            return systemctl.append(argv)
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    schedule = nightly.Schedule(Path(EXPERIMENT), "02:00", 14, make_vars)
    files = schedule.install()
    script = schedule.script_file()
    assert files[0] == script
    # What the schedule itself says to run: /bin/sh and the script, nothing cron or systemd
    # would read a specifier, a variable or a line end in.
    said = files[-2 if systemd else -1].read_text()
    assert f"/bin/sh {script}\n" in said and "%" not in said
    if systemd:
        assert systemctl[-1] == ["systemctl", "enable", "--now", files[-1].name]
    # Run the script with a `make` that records its arguments instead of running.
    recorder = tmp_path / "bin" / "make"
    recorder.parent.mkdir()
    recorder.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    recorder.chmod(0o755)
    subprocess.run(
        ["/bin/sh", str(script)], check=True, env={"PATH": f"{recorder.parent}:/usr/bin:/bin"}
    )
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:3] == ["-C", str(PROJECT), "nightly-run"], argv
    # The real make, given those arguments, runs the nightly batch with the same items.
    line = make_dry(*argv[2:])
    assert "trialbed nightly run" in line and option_values(line, "--set") == EXPECTED
    assert schedule.log_file().parent.is_dir()
    assert nightly.scheduled_command(files[-1]).startswith("make -C ")
    # nightly-status shows it as written: brackets are no markup, the line is not wrapped.
    assert cli.main(["nightly", "status"]) == 0
    (runs,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  runs: ")]
    assert shlex.split(runs.removeprefix("  runs: "))[:-3] == ["make", *argv]
    # Removing the schedule removes its script.
    assert nightly.remove(Path(EXPERIMENT)) and not script.exists()


def test_a_schedule_from_before_the_scripts_is_shown_and_removed(tmp_path, monkeypatch):
    """A cron entry that an earlier version wrote runs its command inline and has no script:
    status shows that command, saying so; remove takes it away."""
    for name in ("UNIT_DIR", "CRON_DIR", "SCRIPT_DIR"):
        monkeypatch.setattr(nightly, name, tmp_path / name)
    (tmp_path / "CRON_DIR").mkdir()
    entry = tmp_path / "CRON_DIR" / "trialbed-nightly-smoke"
    old = "0 2 * * * root make -C /p nightly-run EXPERIMENT=experiments/smoke.yml >> log 2>&1"
    entry.write_text(f"# trialbed nightly batch\nSHELL=/bin/sh\n{old}\n")
    monkeypatch.setattr(nightly, "uses_systemd", lambda: False)
    assert nightly.installed() == [entry]
    shown = nightly.scheduled_command(entry)
    assert shown.startswith(old) and "no script: an earlier install" in shown
    assert nightly.remove(None) == [entry] and not entry.exists()
