// Implemented with its header; see checkpoint_reader.h.
