"""LoRA SFT and what feeds it: the export-sft rows (``export``), which of them train
(``row_selection``) and the trainer (``trainer``)."""
