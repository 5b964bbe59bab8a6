/* tmpl/philox_fill.h — the shared driver of philox.c's fills: a template,
 * included as the body of each fill function (whose parameters seed, offset,
 * dst, begin, end it reads). Define before including (#undef'd at the end):
 *   FD_T            the element type
 *   FD_P            elements per Philox block
 *   FD_XFORM(l, out) turns the 4 lanes of one block into FD_P outputs
 * Both the scalar edge path (partial first/last block) and the batched body
 * call the same FD_XFORM on the same lanes, which is what makes the result
 * independent of how [begin, end) was split.
 *   head: begin not on a block boundary -> compute that block, copy lanes
 *   body: whole blocks, KE_CHUNK at a time, written straight into dst; a
 *         short last batch is transformed in full into a stack buffer and
 *         copied.  Every transform loop thus has the constant trip count
 *         KE_CHUNK: with a variable one, GCC's runtime profitability check
 *         (AVX2, f64) or its -O2 cost model keeps the scalar loop.
 *   tail: trailing partial block
 */
{
    if (begin >= end)
        return;
    ke_keysched ks;
    ke_key_schedule((uint32_t)seed, (uint32_t)(seed >> 32), &ks);
    int64_t i = begin;
    if (i % (FD_P) != 0) {
        uint32_t l_[4];
        FD_T v_[FD_P];
        ke_block(&ks, offset + (uint64_t)(i / (FD_P)), l_);
        FD_XFORM(l_, v_);
        for (; i < end && i % (FD_P) != 0; i++)
            dst[i] = v_[i % (FD_P)];
    }
    while (end - i >= (FD_P)) {
        uint32_t L0[KE_CHUNK], L1[KE_CHUNK], L2[KE_CHUNK], L3[KE_CHUNK];
        int64_t nblk = (end - i) / (FD_P);
        if (nblk > KE_CHUNK)
            nblk = KE_CHUNK;
        ke_blocks(&ks, offset + (uint64_t)(i / (FD_P)), L0, L1, L2, L3);
        if (nblk == KE_CHUNK) {
            FD_T *d_ = dst + i;
            for (int j = 0; j < KE_CHUNK; j++) {
                uint32_t l_[4] = {L0[j], L1[j], L2[j], L3[j]};
                FD_XFORM(l_, d_ + (FD_P) * j);
            }
        } else {
            FD_T b_[KE_CHUNK * (FD_P)];
            for (int j = 0; j < KE_CHUNK; j++) {
                uint32_t l_[4] = {L0[j], L1[j], L2[j], L3[j]};
                FD_XFORM(l_, b_ + (FD_P) * j);
            }
            memcpy(dst + i, b_, (size_t)(nblk * (FD_P)) * sizeof(FD_T));
        }
        i += nblk * (FD_P);
    }
    if (i < end) {
        uint32_t l_[4];
        FD_T v_[FD_P];
        ke_block(&ks, offset + (uint64_t)(i / (FD_P)), l_);
        FD_XFORM(l_, v_);
        for (; i < end; i++)
            dst[i] = v_[i % (FD_P)];
    }
}
#undef FD_T
#undef FD_P
#undef FD_XFORM
