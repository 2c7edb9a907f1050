"""`batchrun report`: one self-contained HTML page about a job, drawn from its journal.

`data`: one streaming pass over the journal (and the manifest, events and cost), memory bounded
by the job's duration and its error codes, never by its requests; `page`: the HTML, its charts
drawn by Chart.js (vendored, inline: the page fetches nothing).
"""

from __future__ import annotations
