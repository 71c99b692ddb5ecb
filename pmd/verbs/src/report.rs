//! How the stand-in reports: diagnostics on stderr, errors in `errno`.

/// One diagnostic line on stderr.
pub(crate) fn log(args: std::fmt::Arguments<'_>) {
    eprintln!("mlx4rs-verbs: {args}");
}

/// Set the calling thread's `errno` (verbs calls returning pointers report errors there).
pub(crate) fn set_errno(e: std::ffi::c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    #[allow(unsafe_code)]
    unsafe {
        *libc::__errno_location() = e
    };
}
