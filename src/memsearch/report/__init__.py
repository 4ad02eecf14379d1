"""``memsearch report``: a self-contained HTML viewer of eval runs (and their comparison and
training curves), plus the static PNG plots (docs/design.md §12).

It sits at the top of the layers with the commands: it reads eval and training records and the
data folder's labels, and nothing below imports it.
"""
