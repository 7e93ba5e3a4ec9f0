// Implemented with its header; see data_writer.h.
