// Implemented with its header; see atomic_file.h.
