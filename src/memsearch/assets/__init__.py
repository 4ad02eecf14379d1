"""What memsearch ships besides code: where its files are (``samples``: the data samples, the
configs loaded by name and the one resolver, ``shipped_path``, for every shipped resource), the
trained memory-policy adapter and its fingerprint (``adapter``), and the embedded GGUF model
(``embedded``)."""
