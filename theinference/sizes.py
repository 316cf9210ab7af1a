"""A size in bytes as text: the one formatter (standard library only: proc/child.py imports it, and both are
copied into the sandbox's stub, proc.sandbox.STUB_FILES)."""


def size_text(nbytes: int) -> str:
    """Bytes in binary units, as every cap is set (`--memory-limit`, THEINFERENCE_RUN_DIR_MB, ...: MB = 2**20
    bytes): '16 MB', '1 GB', '1.1 GB'."""
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f}".removesuffix(".0") + " GB"
    return f"{nbytes / 2**20:.0f} MB"
