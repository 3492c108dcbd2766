"""Reports of a verification run: JSON records for CI dashboards and a
self-contained HTML page with graph pictures and code diffs of each failure.

From pytest: ``--fxverify-json FILE`` and ``--fxverify-html FILE``. Without pytest::

    import fxverify
    from fxverify import reports

    v = fxverify.Verification(my_pass, "resnet18")
    records = reports.records_from_results(v.run_all(), v)   # failures get pictures
    reports.write_json("out/report.json", records)
    reports.write_html("out/report.html", records)
"""

from fxverify.reports.html import render_html, write_html
from fxverify.reports.records import divergence_of, header, json_report, record, records_from_results, write_json

__all__ = [
    "divergence_of",
    "header",
    "json_report",
    "record",
    "records_from_results",
    "render_html",
    "write_html",
    "write_json",
]
