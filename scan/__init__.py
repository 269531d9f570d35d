"""wmark.scan: batch scans of document stores with the detector.

`scan` (the job: source -> batches -> workers -> journal), `batches` (documents cut into
tasks), `loop` (the run: tasks out, rows back in order), `sources`, `sql_source` and `formats`
(what a document store holds and how to read it), `opening` (a file opened without trusting
it) and `limits` (what one document may cost), `workers` (in-process, local processes or
Dask), `journal` (crash-safe, resumable output) and `rows` (one result row per document). The
statistics live in `wmark.detector`; this package only runs them over many documents.
"""
