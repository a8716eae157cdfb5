# Shared C types of the compiled modules (cimport them; never redefine per module).
from libc.stdint cimport uint32_t, uint64_t

ctypedef uint32_t offset_t   # row offset inside one segment (row id - segment base)
ctypedef uint32_t term_id_t  # index of a distinct term inside one segment builder
ctypedef uint64_t doc_id_t   # global row id (segment base + offset)
