"""End-to-end runs through the real CLI: fan-out, artifacts, retries, failures.

These run under the best available sandbox (bwrap in CI), like a user's run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Project

FANOUT = """
name: fan
vars:
  n: 3
steps:
  - id: gather
    run: |
      printf '["a","b","c"]' > out/names.json
      echo gathered
  - id: each
    needs: [gather]
    for_each: "{{ steps.gather.outputs['names.json'] | from_json }}"
    inputs:
      name.txt: "{{ item }}"
      names.json: "{{ steps.gather.outputs['names.json'] }}"
    run: |
      echo "hello $(cat name.txt) from $STOCKADE_STEP/$STOCKADE_ITEM attempt $STOCKADE_ATTEMPT" > out/greeting.txt
      cat out/greeting.txt
  - id: pick
    needs: [each]
    for_each: "{{ steps.each.items }}"
    keep: "{{ item.value != 'b' }}"
  - id: join
    needs: [pick]
    inputs:
      kept.json: "{{ steps.pick.result }}"
      first.txt: "{{ steps.pick.items[0].outputs['greeting.txt'] }}"
    run: cat first.txt; grep -c greeting kept.json
"""


def test_fan_out_with_artifacts_and_keep(project: Project) -> None:
    wf = project.write("wf.yaml", FANOUT)
    r = project.run("run", str(wf), "--run-id", "r1", "--json")
    assert r.code == 0, r.err
    summary = r.json()
    assert summary["status"] == "succeeded"
    assert summary["items"]["each"] == {"succeeded": 3}
    greeting = project.item("r1", "each", 1) / "work" / "out" / "greeting.txt"
    assert greeting.read_text() == "hello b from each/1 attempt 1\n"
    join = (project.item("r1", "join") / "meta" / "1.out").read_text()
    assert join.splitlines()[0] == "hello a from each/0 attempt 1"
    prov = project.provenance("r1", "join")
    sources = {i["name"]: i["source"] for i in prov["inputs"]}
    assert sources["first.txt"]["kind"] == "artifact"
    assert sources["first.txt"]["run_id"] == "r1"
    assert sources["first.txt"]["step"] == "each"
    assert sources["first.txt"]["item"] == 0


def test_manifest_records_run_workflow_inputs_and_sandbox(project: Project) -> None:
    project.write("data/in.txt", "payload\n")
    wf = project.write("wf.yaml", """
        name: m
        vars: {day: "2026-09-14"}
        steps:
          - id: a
            inputs:
              in.txt: "{{ file('data/in.txt') }}"
            run: cat in.txt
    """)
    r = project.run("run", str(wf), "--run-id", "m1", "--var", "day=2026-09-15")
    assert r.code == 0, r.err
    m = json.loads((project.root / "runs" / "m1" / "manifest.json").read_text())
    assert m["run_id"] == "m1"
    assert m["vars"] == {"day": "2026-09-15"}
    assert m["workflow"]["sha256"]
    import hashlib

    assert m["input_fingerprints"]["file:data/in.txt"] == hashlib.sha256(b"payload\n").hexdigest()
    assert m["sandbox"]["backend"]
    assert isinstance(m["sandbox"]["enforced"], bool)
    assert m["engine"]["version"]
    # A workflow without warnings: none recorded, none shown.
    assert m["warnings"] == []
    assert "warning" not in project.run("show", "m1").out
    assert project.run("show", "m1", "--json").json()["warnings"] == []


def test_reused_run_id_is_refused_and_nothing_is_touched(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: r
        steps:
          - id: a
            run: echo first > out/x.txt
    """)
    assert project.run("run", str(wf), "--run-id", "same").code == 0
    before = (project.item("same", "a") / "work" / "out" / "x.txt").stat().st_mtime_ns
    r = project.run("run", str(wf), "--run-id", "same")
    assert r.code == 2
    assert "never reused" in r.err
    assert "Traceback" not in r.err
    assert (project.item("same", "a") / "work" / "out" / "x.txt").stat().st_mtime_ns == before


@pytest.mark.parametrize("bad", ["../x", ".hidden", "a/b", "x" * 129])
def test_invalid_run_id_exits_2(project: Project, bad: str) -> None:
    wf = project.write("wf.yaml", "name: r\nsteps:\n  - id: a\n    run: 'true'\n")
    r = project.run("run", str(wf), "--run-id", bad)
    assert r.code == 2
    assert "invalid run id" in r.err
    assert not (project.root / "runs").exists() or not any((project.root / "runs").iterdir())


def test_retry_never_sees_previous_attempt_files(project: Project) -> None:
    # Attempt 1 writes its report then fails (like a model call that timed out);
    # attempt 2 must not find it and "skip generation".
    wf = project.write("wf.yaml", """
        name: retry
        steps:
          - id: summarise
            retries: 2
            run: |
              if [ -e out/report.json ] || [ -e stale.txt ]; then echo "SAW STALE"; exit 3; fi
              echo "{\\"attempt\\": $STOCKADE_ATTEMPT}" > out/report.json
              touch stale.txt
              [ "$STOCKADE_ATTEMPT" -ge 2 ] || exit 1
    """)
    r = project.run("run", str(wf), "--run-id", "t1")
    assert r.code == 0, r.err
    item = project.item("t1", "summarise")
    assert json.loads((item / "work" / "out" / "report.json").read_text()) == {"attempt": 2}
    # (Attempt 2 printed nothing, so it has no stdout capture; "SAW STALE" would make one.)
    assert not (item / "meta" / "2.out").exists()
    # The first attempt's tree is kept for inspection, outside the jail's world.
    assert (item / "meta" / "1" / "work" / "out" / "report.json").exists()
    show = project.run("show", "t1", "summarise/0", "--json").json()
    assert [a["outcome"] for a in show["attempts"]] == ["failed", "succeeded"]


def test_failed_item_skips_dependents_but_not_independent_branches(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: branches
        steps:
          - id: bad
            run: exit 7
          - id: after-bad
            needs: [bad]
            run: echo never
          - id: good
            run: echo fine > out/ok.txt
          - id: after-good
            needs: [good]
            inputs:
              ok.txt: "{{ steps.good.outputs['ok.txt'] }}"
            run: cat ok.txt
    """)
    r = project.run("run", str(wf), "--run-id", "b1", "--json")
    assert r.code == 1
    s = r.json()
    assert s["steps"] == {"bad": "failed", "after-bad": "skipped", "good": "succeeded",
                          "after-good": "succeeded"}
    assert any("exit status 7" in p for p in s["problems"])
    # The skipped step's one record counts, as show counts it.
    assert s["items"] == {"bad": {"failed": 1}, "after-bad": {"skipped": 1},
                          "good": {"succeeded": 1}, "after-good": {"succeeded": 1}}
    # The skipped item's record holds the reason; its status is said once.
    shown = project.run("show", "b1", "after-bad/0").out
    assert "status skipped  bad did not succeed" in shown, shown
    logs = project.run("logs", "b1", "after-bad/0")
    assert logs.code == 2
    assert "after-bad/0 never started an attempt (skipped: bad did not succeed)" in logs.err
    assert "skipped: skipped" not in shown + logs.err


def test_an_output_written_to_work_instead_of_out_is_named(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: strayed
        steps:
          - id: a
            inputs: {given.csv: "a,b"}
            run: echo hi > x.txt; echo 1 > out/y.txt
            outputs: [x.txt, y.txt, "*.csv"]
          - id: b
            run: "true"
            outputs: [z.txt]
    """)
    r = project.run("run", str(wf), "--run-id", "s1", "--json")
    assert r.code == 1
    problems = r.json()["problems"]
    # The input given.csv is in work/ too, but it is not something the step wrote.
    assert any(p.endswith("missing out/x.txt, out/*.csv (x.txt is in work/: outputs are what "
                          "the step writes under out/)") for p in problems), problems
    assert any(p.endswith("missing out/z.txt") for p in problems), problems


def test_timeout_kills_the_whole_process_group(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: slow
        steps:
          - id: hang
            timeout: 1
            run: |
              sleep 301.5 &
              sleep 301.5
    """)
    t0 = time.monotonic()
    r = project.run("run", str(wf), "--run-id", "h1", "--json")
    assert r.code == 1
    assert time.monotonic() - t0 < 30
    assert any("timed out after 1s" in p for p in r.json()["problems"])
    time.sleep(0.5)
    assert _processes("sleep 301.5") == []


def _processes(cmdline: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if raw.replace(b"\0", b" ").decode(errors="replace").strip() == cmdline:
            found.append(pid)
    return found


def test_environment_is_built_not_inherited_and_secrets_are_masked(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: env
        secrets: [API_TOKEN]
        steps:
          - id: with-secret
            secrets: [API_TOKEN]
            env: {GREETING: hi}
            run: |
              echo "token=$API_TOKEN greeting=$GREETING canary=${HOST_CANARY:-absent}"
              echo "err $API_TOKEN" >&2
          - id: without
            run: echo "token=${API_TOKEN:-absent} canary=${HOST_CANARY:-absent}"
    """)
    secret = "s3cr3t-value-123456"
    r = project.run("run", str(wf), "--run-id", "e1",
                    env={"API_TOKEN": secret, "HOST_CANARY": "leaked"})
    assert r.code == 0, r.err
    w = (project.item("e1", "with-secret") / "meta/1.out").read_text()
    assert w.strip() == "token=******** greeting=hi canary=absent"
    assert secret not in (project.item("e1", "with-secret") / "meta/1.err").read_text()
    wo = (project.item("e1", "without") / "meta/1.out").read_text()
    assert wo.strip() == "token=absent canary=absent"
    for path in project.root.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_stockade_variables_are_set(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: vars
        steps:
          - id: s
            for_each: [x, y]
            run: echo "$STOCKADE_RUN_ID $STOCKADE_STEP $STOCKADE_ITEM $STOCKADE_ATTEMPT"
    """)
    r = project.run("run", str(wf), "--run-id", "v1")
    assert r.code == 0, r.err
    assert (project.item("v1", "s", 1) / "meta/1.out").read_text() == "v1 s 1 1\n"


def test_run_values_are_shell_quoted(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: quote
        vars:
          evil: "x'; touch pwned; echo '"
        steps:
          - id: s
            run: echo {{ vars.evil }}
    """)
    r = project.run("run", str(wf), "--run-id", "q1")
    assert r.code == 0, r.err
    assert not (project.item("q1", "s") / "work" / "pwned").exists()
    assert (project.item("q1", "s") / "meta/1.out").read_text() == \
        "x'; touch pwned; echo '\n"


def test_symlink_in_out_is_refused_and_not_copied_downstream(project: Project) -> None:
    project.write("host-secret.txt", "TOP SECRET")
    wf = project.write("wf.yaml", """
        name: links
        steps:
          - id: a
            run: ln -s /etc/hostname out/link.txt
          - id: b
            needs: [a]
            inputs:
              x: "{{ steps.a.outputs['link.txt'] }}"
            run: cat x
    """)
    r = project.run("run", str(wf), "--run-id", "l1", "--json")
    assert r.code == 1
    assert any("symlink" in p for p in r.json()["problems"])
    assert r.json()["steps"]["b"] == "skipped"


def test_out_replaced_by_a_symlink_is_refused(project: Project) -> None:
    # out/ itself a link to a host folder: the engine must not list, hash and
    # hand downstream what the link points at.
    secret_dir = project.write("host-secrets/key.txt", "TOP SECRET").parent
    wf = project.write("wf.yaml", f"""
        name: outlink
        steps:
          - id: a
            run: rm -rf out && ln -s {secret_dir} out
          - id: b
            needs: [a]
            inputs:
              x: "{{{{ steps.a.outputs['key.txt'] }}}}"
            run: cat x
    """)
    r = project.run("run", str(wf), "--run-id", "ol1", "--json")
    assert r.code == 1, r.err
    assert any("symlink" in p for p in r.json()["problems"]), r.json()
    assert r.json()["steps"]["b"] == "skipped"
    for path in (project.root / "runs" / "ol1").rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert b"TOP SECRET" not in path.read_bytes(), path


def test_tampered_artifact_fails_the_consumer(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: tamper
        steps:
          - id: a
            run: echo original > out/x.txt
          - id: b
            needs: [a]
            inputs:
              x.txt: "{{ steps.a.outputs['x.txt'] }}"
            run: cat x.txt
    """)
    assert project.run("run", str(wf), "--run-id", "t1").code == 0
    # Overwrite a's output as another run or a careless script would, then
    # resume after forgetting b: the changed file must not flow on.
    (project.item("t1", "a") / "work/out/x.txt").write_text("forged\n")
    r = project.run("resume", "t1", "--json")
    # a no longer verifies, so it reruns in a fresh attempt; b sees only a's new output.
    assert r.code == 0, r.err
    assert (project.item("t1", "a") / "work/out/x.txt").read_text() == "original\n"
    assert (project.item("t1", "b") / "work/x.txt").read_text() == "original\n"
    # The rerun is said, with its reason: a changed output is news to the operator.
    assert "a/0: out/x.txt no longer matches the sha256 recorded when it was made; it runs " \
           "again" in r.err, r.err
    (project.item("t1", "a") / "work/out/x.txt").unlink()
    r = project.run("resume", "t1")
    assert r.code == 0 and "a/0: out/x.txt is gone; it runs again" in r.err, r.err


def test_sigint_interrupts_cleanly_with_130(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: int
        steps:
          - id: slow
            for_each: [1, 2, 3, 4]
            run: echo started; sleep 60
    """)
    p = project.popen("run", str(wf), "--run-id", "i1")
    _wait_for(lambda: (project.item("i1", "slow", 0) / "meta/1.out").exists())
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err
    runs = project.run("runs", "--json").json()
    assert runs[0]["status"] == "interrupted"


def _wait_for(cond: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met")


def test_sigkill_then_resume_keeps_verified_items(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: crash
        secrets: [SLOW]
        steps:
          - id: work
            for_each: [0, 1, 2, 3, 4, 5]
            secrets: [SLOW]
            inputs:
              i.txt: "{{ item }}"
            run: |
              i=$(cat i.txt)
              if [ "$i" -ge 3 ] && [ -n "${SLOW:-}" ]; then sleep 302.5; fi
              echo "result $i" > out/r.txt
              echo "$i"
          - id: total
            needs: [work]
            inputs:
              all.json: "{{ steps.work.result }}"
            run: cat all.json
    """)
    # The first run is slow from item 3 on (SLOW is a host variable the step
    # lists as a secret); the resumed one is not.
    p = project.popen("run", str(wf), "--run-id", "k1", "--jobs", "2", env={"SLOW": "yes"})
    _wait_for(lambda: {0, 1, 2} <= project.succeeded("k1", "work"))
    _wait_for(lambda: len(_processes("sleep 302.5")) >= 1)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    # Declared secrets must be set (preflight); set but empty, SLOW makes no item slow.
    r = project.run("resume", "k1", "--json", env={"SLOW": ""}, timeout=180)
    assert r.code == 0, r.err
    attempts = {}
    for i in range(6):
        show = project.run("show", "k1", f"work/{i}", "--json").json()
        assert show["items"][0]["status"] == "succeeded"
        attempts[i] = [a["attempt"] for a in show["attempts"]]
    # Verified items were not rerun; interrupted ones ran again in attempt 2.
    assert attempts[0] == attempts[1] == attempts[2] == [1]
    assert attempts[3] == [1, 2]
    lost = project.run("show", "k1", "work/3", "--json").json()["attempts"][0]
    assert lost["outcome"] == "lost"
    # Its times are the resume's, and it says so (it read as a 0 s attempt).
    assert lost["message"] == ("the engine stopped during this attempt (when it began was not "
                               "recorded: its times are the resume's)")
    assert attempts[4][-1] in (1, 2) and attempts[5][-1] in (1, 2)
    total = (project.item("k1", "total") / "meta/1.out").read_text()
    assert json.loads(total) == ["0", "1", "2", "3", "4", "5"]
    for i in range(6):
        assert (project.item("k1", "work", i) / "work/out/r.txt").read_text() == f"result {i}\n"
    # The run's duration spans the crash; show says it was resumed.
    assert project.run("show", "k1", "--json").json()["run"]["resumes"] == 1
    assert "(first start to last end; resumed once)" in project.run("show", "k1").out


def test_resume_refuses_a_changed_workflow(project: Project) -> None:
    wf = project.write("wf.yaml", "name: c\nsteps:\n  - id: a\n    run: exit 1\n")
    assert project.run("run", str(wf), "--run-id", "c1").code == 1
    wf.write_text("name: c\nsteps:\n  - id: a\n    run: exit 0\n")
    r = project.run("resume", "c1")
    assert r.code == 2
    assert "changed since run c1 started" in r.err


def test_resume_of_a_finished_run_reruns_nothing(project: Project) -> None:
    marker = project.path / "count"
    wf = project.write("wf.yaml", f"""
        name: done
        steps:
          - id: a
            for_each: [1, 2]
            isolate: false
            run: echo x >> {marker}; echo ok > out/o.txt
    """)
    assert project.run("run", str(wf), "--run-id", "d1").code == 0
    assert project.run("resume", "d1").code == 0
    assert marker.read_text().count("x") == 2


def test_why_shows_the_provenance_chain(project: Project) -> None:
    wf = project.write("wf.yaml", FANOUT)
    assert project.run("run", str(wf), "--run-id", "w1").code == 0
    chain = project.run("why", "w1", "join", "--json").json()
    first = next(i for i in chain["inputs"] if i["name"] == "first.txt")
    assert first["from"]["step"] == "each"
    assert first["from"]["inputs"][1]["from"]["step"] == "gather"
    kept = next(i for i in chain["inputs"] if i["name"] == "kept.json")
    assert kept["source"] == {"kind": "json", "refs": ["steps.pick.result"]}
    text = project.run("why", "w1", "each/0", "greeting.txt")
    assert text.code == 0 and "gather/0:out/names.json" in text.out


def test_logs_and_runs(project: Project) -> None:
    wf = project.write("wf.yaml", "name: l\nsteps:\n  - id: a\n    run: echo hello; echo oops >&2\n")
    assert project.run("run", str(wf), "--run-id", "lg").code == 0
    assert project.run("logs", "lg", "a/0").out == "hello\n"
    assert project.run("logs", "lg", "a/0", "--stderr").out == "oops\n"
    assert "lg" in project.run("runs").out


def test_none_backend_is_announced_and_recorded_everywhere(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: unjailed
        steps:
          - id: a
            run: echo x > out/x.txt
    """)
    r = project.run("run", str(wf), "--run-id", "n1", "--sandbox", "none")
    assert r.code == 0, r.err
    assert "NOT ENFORCED" in r.err.splitlines()[1]
    manifest = json.loads((project.root / "runs/n1/manifest.json").read_text())
    assert manifest["sandbox"]["backend"] == "none"
    assert manifest["sandbox"]["enforced"] is False
    assert manifest["sandbox"]["limitations"]
    prov = project.provenance("n1", "a")
    assert prov["sandbox"]["enforced"] is False
    assert [o["enforced"] for o in prov["outputs"]] == [False]
    assert "not enforced" in project.run("runs").out


def test_isolate_false_is_recorded_as_an_opt_out(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: optout
        steps:
          - id: jailed
            run: echo x > out/x.txt
          - id: free
            isolate: false
            run: echo y > out/y.txt
    """)
    r = project.run("run", str(wf), "--run-id", "o1")
    assert r.code == 0, r.err
    assert "free: isolate: false - runs WITHOUT a sandbox" in r.err
    jailed = project.provenance("o1", "jailed")
    free = project.provenance("o1", "free")
    assert free["sandbox"] == {"backend": "none", "enforced": False, "isolate": False}
    assert jailed["sandbox"]["isolate"] is True
    assert jailed["sandbox"]["enforced"] is True


def test_repeated_item_keys_stop_the_step_before_any_item_runs(project: Project) -> None:
    # The items come from a step's output, so the keys are known only when
    # the step is expanded (a literal list is refused before the run:
    # tests/integration/test_user_errors.py).
    wf = project.write("wf.yaml", """
        name: dup
        steps:
          - id: gather
            run: echo '["a", "b", "c", "b"]' > out/l.json
            outputs: [l.json]
          - id: fan
            needs: [gather]
            for_each: "{{ steps.gather.outputs['l.json'] | from_json }}"
            key: "{{ item | upper }}"
            run: echo {{ item }} > out/x.txt
            outputs: [x.txt]
          - id: after
            needs: [fan]
            run: echo done
    """)
    r = project.run("run", str(wf), "--run-id", "k1")
    assert r.code == 1, r.err
    assert "Traceback" not in r.err
    assert re.search(r"wf\.yaml:\d+:\d+: keys must be unique within the step; repeated: B$",
                     r.out + r.err, re.MULTILINE), r.out + r.err
    assert "after: skipped" in r.out + r.err
    # No item was made, so none ran.
    fan = project.root / "runs" / "k1" / "fan"
    assert not fan.exists() or not any(fan.iterdir())


def test_a_fan_out_over_an_empty_list_succeeds_and_says_it_had_no_items(project: Project) -> None:
    wf = project.write("wf.yaml", """
        name: empty
        steps:
          - id: gather
            run: echo '[]' > out/l.json
            outputs: [l.json]
          - id: fan
            needs: [gather]
            for_each: "{{ steps.gather.outputs['l.json'] | from_json }}"
            run: echo never
          - id: after
            needs: [fan]
            inputs:
              all.json: "{{ steps.fan.result }}"
            run: cat all.json
          - id: later
            needs: [nothing_yet]
            run: exit 0
          - id: nothing_yet
            run: exit 3
    """)
    r = project.run("run", str(wf), "--run-id", "e1")
    assert r.code == 1, r.err  # nothing_yet fails, so later never starts
    assert (project.item("e1", "after") / "meta/1.out").read_text() == "[]"
    shown = project.run("show", "e1").out
    assert "fan (run): no items (its for_each gave an empty list)" in shown
    assert "later (run): 1 skipped" in shown


def test_hole_inside_quotes_warns_and_the_warning_is_true(project: Project) -> None:
    """``"{{ item }}"`` keeps the quote that run: adds; validate and run say so
    at the hole, and the run still goes ahead (it is not an error)."""
    project.write("wf.yaml", """
        name: quoted
        steps:
          - id: s
            for_each: ["a b"]
            run: |
              printf '%s\\n' "{{ item }}" > out/quoted.txt
              printf '%s\\n' {{ item }} > out/bare.txt
    """)
    warning = ("wf.yaml:7:22: warning: step 's': {{ item }} is inside \"...\", but run: "
               "already shell-quotes each value, so a value such as a b would come out as "
               "'a b'; leave out the quotes around it")
    v = project.run("validate", "wf.yaml")
    assert v.code == 0, v.err
    assert v.out.startswith("wf.yaml: ok")
    assert v.err.strip() == warning
    r = project.run("run", "wf.yaml", "--run-id", "r1", "--json")
    assert r.code == 0, r.err
    assert r.json()["status"] == "succeeded"
    assert [line for line in r.err.splitlines() if "warning:" in line] == [warning]
    # The run's record keeps it: show, and show --json.
    shown = project.run("show", "r1")
    assert warning in shown.out.splitlines()
    assert project.run("show", "r1", "--json").json()["warnings"] == [warning]
    out = project.item("r1", "s") / "work" / "out"
    assert (out / "quoted.txt").read_text() == "'a b'\n"
    assert (out / "bare.txt").read_text() == "a b\n"


def test_a_resumed_runs_retry_line_names_the_attempt_as_show_does(project: Project) -> None:
    project.write("wf.yaml", """
        name: again
        steps:
          - id: s
            retries: 1
            retry_delay: 0
            run: echo no >&2; exit 3
    """)
    first = project.run("run", "wf.yaml", "--run-id", "a1")
    assert first.code == 1
    assert "s/0: attempt 1 failed (exit status 3)" in first.err
    again = project.run("resume", "a1")
    assert again.code == 1
    # Attempts 1 and 2 are the first run's: this one made 3 and 4.
    assert "s/0: attempt 3 failed (exit status 3)" in again.err, again.err
    assert "s/0: failed (attempt 4)" in again.err
    shown = project.run("show", "a1", "s", "--json").json()
    assert [a["attempt"] for a in shown["attempts"]] == [1, 2, 3, 4]


@pytest.mark.parametrize("args", [("--status", "bogus"), ("--limit", "0")])
def test_runs_refuses_a_filter_that_cannot_match(project: Project, args: tuple[str, str]) -> None:
    r = project.run("runs", *args)
    assert r.code == 2
    assert f"Invalid value for '{args[0]}'" in r.err
    assert "Traceback" not in r.err


def test_a_steps_stderr_cannot_drive_the_operators_terminal(project: Project) -> None:
    """A step's stderr tail and message were printed raw: an escape sequence
    set the terminal's title, recoloured or rewrote the report's lines (an
    OSC ended by ESC \\ survived whole). They are shown escaped; `logs`
    still gives the bytes as written."""
    wf = project.write("wf.yaml", r"""
        name: esc
        steps:
          - id: p
            run: |
              printf '\033]0;PWNED\033\\\033[2K\rp/0: ok\n' >&2
              exit 3
    """)
    r = project.run("run", str(wf), "--run-id", "esc1")
    assert r.code == 1, r.err
    shown = project.run("show", "esc1", "p/0")
    for out in (r.err, shown.out):
        assert "\x1b" not in out and "\r" not in out, out
        assert "\\x1b]0;PWNED\\x1b\\\\\\x1b[2K\\rp/0: ok" in out, out
    logs = project.run("logs", "esc1", "p/0", "--stderr")
    assert "\x1b]0;PWNED" in logs.out
