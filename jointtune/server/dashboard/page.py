"""A dashboard page: one self-contained HTML document (inline CSS, inline SVG, a small filter script).

No CDN and no external assets: the page must work on machines without internet access, and the
service must not make a browser fetch anything from elsewhere.
"""

from __future__ import annotations

import json
from html import escape

from jointtune._version import __version__
from jointtune.db import Record
from jointtune.server.dashboard.data import DashboardData, StudyCurve, shape_order
from jointtune.server.dashboard.svg import curve_svg, heatmap_svg, legend_svg, shape_label

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:14px 28px;display:flex;align-items:baseline;gap:18px}
header h1{font-size:20px;margin:0}header .muted{color:#c9d1d9}
main{padding:8px 28px 40px;max-width:1400px}
section.card{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 6px;color:#57606a}
.stats{display:flex;gap:12px;flex-wrap:wrap;margin:16px 0 0}
.stat{background:#fff;border:1px solid #d0d7de;border-radius:8px;padding:8px 16px;min-width:110px}
.stat b{display:block;font-size:22px}.stat span{color:#57606a;font-size:12px}
.muted{color:#57606a}.empty{padding:18px;text-align:center;color:#57606a;background:#fff;
border:1px dashed #d0d7de;border-radius:8px;margin:16px 0}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;text-align:left;white-space:nowrap}
th{background:#f6f8fa;position:sticky;top:0}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.cfg{white-space:normal;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.scroll{max-height:420px;overflow:auto}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .hm-col{font-weight:600}
svg .hm-empty{fill:#fafbfc;stroke:#eaeef2}svg .hm-cell text{font-weight:600}
svg .plot-bg{fill:#fbfcfd;stroke:#d0d7de}svg .grid{stroke:#eaeef2}
svg .trial-pt{fill:#8c959f;opacity:.55}svg .best-line{fill:none;stroke:#0969da;stroke-width:2}
svg .curve-pt{fill:#0969da}svg .axis{fill:#57606a}
.curves{display:grid;grid-template-columns:repeat(auto-fill,minmax(410px,1fr));gap:14px}
.curves .card{margin:0}.curves h3{margin:0 0 4px;color:#1f2328;word-break:break-all}
#filter{padding:5px 9px;border:1px solid #d0d7de;border-radius:6px;width:280px;margin-left:auto}
.good{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}
.pager{margin:14px 0 0}.pager a{color:#0969da;text-decoration:none}
"""

# Filters the config tables as the user types; rows carry their text in data-search.
_SCRIPT = """
(function(){
  var box=document.getElementById('filter');if(!box)return;
  function apply(){
    var q=box.value.trim().toLowerCase(),shown=0;
    document.querySelectorAll('tr[data-search]').forEach(function(tr){
      var ok=!q||tr.getAttribute('data-search').indexOf(q)>=0;tr.style.display=ok?'':'none';if(ok)shown++;});
    document.getElementById('shown').textContent=shown+(q?' rows match':' rows');
  }
  box.addEventListener('input',apply);apply();
})();
"""


def _stat(value: object, label: str) -> str:
    return f'<div class="stat"><b>{escape(str(value))}</b><span>{escape(label)}</span></div>'


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _speedup_cell(value: float | None) -> str:
    if value is None:
        return '<td class="num">—</td>'
    cls = "good" if value >= 1.0 else "bad"
    return f'<td class="num {cls}">{value:.2f}×</td>'


def _config_text(config: dict[str, object]) -> str:
    return " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sorted(config.items()))


def _table(records: list[Record]) -> str:
    head = (
        "<tr><th>kernel version</th><th>shape</th><th>dtype</th><th>world</th><th>timing</th><th>config</th>"
        "<th>p50 µs</th><th>baseline µs</th><th>speedup</th><th>trials</th><th>study</th><th>updated</th></tr>"
    )
    rows = []
    ordered = sorted(records, key=lambda r: (r.kernel_version, shape_order(r.shape), r.dtype, r.world_size, r.timing))
    for r in ordered:
        shape, config = shape_label(r.shape), _config_text(r.config)
        search = f"{r.kernel} {r.hardware_id} {r.kernel_version} {shape} {r.dtype} w{r.world_size} {r.timing} {config}"
        rows.append(
            f'<tr class="config-row" data-search="{escape(search.lower())}"><td>{escape(r.kernel_version)}</td>'
            f'<td class="shape">{escape(shape)}</td><td>{escape(r.dtype)}</td><td class="num">{r.world_size}</td>'
            f"<td>{escape(r.timing)}</td>"
            f'<td class="cfg">{escape(config)}</td><td class="num">{_fmt(r.latency_p50_us)}</td>'
            f'<td class="num">{_fmt(r.baseline_us)}</td>{_speedup_cell(r.speedup)}'
            f'<td class="num">{r.trials}</td><td class="muted">{escape(r.study_name or "—")}</td>'
            f'<td class="muted">{r.updated_at:%Y-%m-%d %H:%M}</td></tr>'
        )
    return (
        f'<div class="scroll"><table class="configs"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'
    )


def _kernel_section(kernel: str, hardware_id: str, records: list[Record]) -> str:
    versions = sorted({r.kernel_version for r in records})
    maps = []
    for version in versions:
        mine = [r for r in records if r.kernel_version == version]
        title = f"<h3>speedup vs baseline, kernel version {escape(version)}</h3>" if len(versions) > 1 else ""
        maps.append(
            f'{title}<div class="heatmap-wrap" data-kernel-version="{escape(version)}">{heatmap_svg(mine)}</div>'
        )
    return (
        f'<section class="card kernel" data-kernel="{escape(kernel)}" data-hardware="{escape(hardware_id)}">'
        f'<h2>{escape(kernel)} <span class="muted">on {escape(hardware_id)} · {len(records)} configs</span></h2>'
        f"<h3>speedup vs baseline (rows: shapes by M; columns: dtype / world size / timing)</h3>{''.join(maps)}"
        f"{legend_svg()}<h3>tuned configs</h3>{_table(records)}</section>"
    )


def _curve_card(curve: StudyCurve) -> str:
    best = "—" if curve.best is None else f"{curve.best:.4g} µs"
    facts = f"{len(curve.points)} complete, {curve.failed} failed · best {best}"
    return (
        f'<section class="card study" data-study="{escape(curve.name)}"><h3>{escape(curve.label)}</h3>'
        f'<div class="muted">{escape(facts)}</div>{curve_svg(curve)}</section>'
    )


def _curves(data: DashboardData) -> str:
    if data.studies_error:
        body = f'<div class="empty">{escape(data.studies_error)}.</div>'
    elif not data.curves:
        body = '<div class="empty" id="no-studies">No tuning studies in this database yet.</div>'
    else:
        more = len(data.curves) < data.total_studies
        note = f'<p class="muted">The {len(data.curves)} newest of {data.total_studies} studies.</p>' if more else ""
        body = note + '<div class="curves">' + "".join(_curve_card(c) for c in data.curves) + "</div>"
    return f'<h2 style="margin-top:26px">Tuning curves <span class="muted">best latency vs trial</span></h2>{body}'


def _pager(data: DashboardData) -> str:
    """Where this page's records are among all, and links to the pages beside it."""
    if data.pages == 1:
        return ""
    first = (data.page - 1) * data.per_page + 1
    last = first + len(data.records) - 1
    links = []
    if data.page > 1:
        links.append(f'<a rel="prev" href="?page={data.page - 1}">‹ page {data.page - 1}</a>')
    if data.page < data.pages:
        links.append(f'<a rel="next" href="?page={data.page + 1}">page {data.page + 1} ›</a>')
    return (
        f'<nav class="pager muted">configs {first:,}–{last:,} of {data.total_records:,} · page {data.page} of '
        f"{data.pages:,} · {' · '.join(links)}</nav>"
    )


def render_page(data: DashboardData, *, backend: str) -> str:
    """One page of the dashboard as one HTML string."""
    groups = data.groups()
    stats = (
        _stat(f"{data.total_records:,}", "tuned configs")
        + _stat(data.kernels, "kernels")
        + _stat(data.hardware, "hardware")
        + _stat(data.total_studies, "studies")
    )
    if groups:
        body = "".join(_kernel_section(k, h, records) for (k, h), records in groups)
    else:
        body = (
            '<div class="empty" id="no-records">No tuned configs yet. Publish one with <code>POST /v1/configs</code>, '
            "import a bundle, or run <code>jointtune tune</code>.</div>"
        )
    search = (
        '<input id="filter" type="search" placeholder="filter configs: kernel, shape, dtype…"><span id="shown" '
        'class="muted"></span>'
        if groups
        else ""
    )
    curves = _curves(data) if data.page == 1 else ""
    pager = _pager(data)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>jointtune dashboard</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head><body>'
        f'<header><h1>jointtune</h1><span class="muted">config service {escape(__version__)} · '
        f"{escape(backend)} store</span>{search}</header>"
        f'<main><div class="stats">{stats}</div>{pager}{body}{pager}{curves}</main><script>{_SCRIPT}</script>'
        "</body></html>"
    )
