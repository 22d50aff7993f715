"""JUnit XML of an SLO verdict: one test case per objective, for any CI system's test view.

Failures are ``<failure>``; inconclusive objectives are ``<failure type="inconclusive">``
under the "fail" policy and ``<skipped>`` under "pass". A run that is not valid evidence
(saturated generator, too few requests, unreadable file) gets one more case, "valid evidence",
with an ``<error>``.

Example::

    write_junit(verdict, "reports/slo-junit.xml")
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab._report.text import objective_line

if TYPE_CHECKING:
    from loadlab._slo import ObjectiveResult, Verdict

__all__ = ["render_junit", "write_junit"]

# Characters XML 1.0 cannot hold at all (escaping does not help): drop them.
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _XML_BAD.sub("", text)


def _details(r: ObjectiveResult) -> str:
    return _clean(objective_line(r))


def render_junit(verdict: Verdict, suite: str = "loadlab slo") -> str:
    """The verdict as a JUnit XML document (a string)."""
    name = _clean(f"{suite}: {verdict.name}" if verdict.name else suite)
    cases = []
    failures = errors = skipped = 0
    for r in verdict.rows:
        case = ET.Element(
            "testcase",
            classname=_clean(f"loadlab._slo.{r.objective.metric}"),
            name=_clean(str(r.objective)),
            time="0",
        )
        text = _details(r)
        if r.status == "fail":
            failures += 1
            ET.SubElement(case, "failure", message=text, type="fail").text = text
        elif r.status == "inconclusive" and verdict.inconclusive_policy == "fail":
            failures += 1
            ET.SubElement(case, "failure", message=text, type="inconclusive").text = text
        elif r.status == "inconclusive":
            skipped += 1
            ET.SubElement(case, "skipped", message=text)
        ET.SubElement(case, "system-out").text = text
        cases.append(case)
    if verdict.invalid_reasons:
        errors += 1
        case = ET.Element("testcase", classname="loadlab._slo", name="valid evidence", time="0")
        reasons = _clean("; ".join(verdict.invalid_reasons))
        ET.SubElement(case, "error", message=reasons, type="invalid").text = reasons
        cases.append(case)
    counts = {
        "tests": str(len(cases)),
        "failures": str(failures),
        "errors": str(errors),
        "skipped": str(skipped),
    }
    attrs = {"name": name, **counts}
    root = ET.Element("testsuites", attrs)
    ts = ET.SubElement(root, "testsuite", attrs)
    props = ET.SubElement(ts, "properties")
    ET.SubElement(props, "property", name="outcome", value=verdict.outcome)
    ET.SubElement(props, "property", name="exit_code", value=str(verdict.exit_code))
    ET.SubElement(props, "property", name="confidence", value=f"{verdict.confidence:g}")
    ET.SubElement(props, "property", name="inconclusive_policy", value=verdict.inconclusive_policy)
    ts.extend(cases)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(verdict: Verdict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_junit(verdict), encoding="utf-8")
    return p
