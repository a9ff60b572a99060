# Sourced by scripts/quickstart.sh: run the main job on jemalloc when the system has it.
# Why: glibc's malloc keeps freed blocks resident (generation's per-batch copies, the backward's
# activations): the main job peaked near 3.9 GB on it, against 3.57-3.66 GB on jemalloc with freed pages
# handed back within 2 s by a background thread (0-8% more time per step than jemalloc's default, which
# peaked at 3.68-3.78 GB and was faster than glibc). docs/real-models.md, "Memory". scripts/setup.sh installs it (Debian's libjemalloc2).
# LUDIC_ALLOCATOR=jemalloc (default) | tcmalloc | glibc; an LD_PRELOAD or MALLOC_CONF already set is kept.
ludic_preload_allocator() {
    local lib path listing
    [ -z "${LD_PRELOAD:-}" ] || return 0
    case "${LUDIC_ALLOCATOR:-jemalloc}" in
        glibc) return 0 ;;
        jemalloc) lib=libjemalloc.so.2 ;;
        tcmalloc) lib=libtcmalloc_minimal.so.4 ;;
        *) echo "LUDIC_ALLOCATOR must be jemalloc, tcmalloc or glibc, got '${LUDIC_ALLOCATOR}'" >&2; return 2 ;;
    esac
    # the whole listing first, then a reader that reads to its end: no SIGPIPE under the caller's pipefail
    listing="$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)"
    path="$(printf '%s\n' "$listing" | awk -v lib="$lib" '$1 == lib && !found { print $NF; found = 1 }')"
    if [ -z "$path" ]; then
        echo "[quickstart] $lib not found: glibc's malloc (about 0.3 GB more at the peak; scripts/setup.sh installs it)" >&2
        return 0
    fi
    export LD_PRELOAD="$path"
    if [ "$lib" = libjemalloc.so.2 ]; then
        export MALLOC_CONF="${MALLOC_CONF:-background_thread:true,dirty_decay_ms:2000,muzzy_decay_ms:0}"
    fi
    echo "[quickstart] allocator: $path${MALLOC_CONF:+ ($MALLOC_CONF)}" >&2
}
