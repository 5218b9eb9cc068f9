"""The plain draw's row uniform on the host (philox.cuh's row_uniform), for the debug scripts."""


def row_uniform(seed):
    mask = 0xFFFFFFFF
    pattern = seed % 2**64
    c0, c1, c2, c3 = 0, 1, 0x726C6B73, 0
    k0, k1 = pattern & mask, pattern >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & mask, p1 & mask, ((p0 >> 32) ^ c3 ^ k1) & mask, p0 & mask
        k0, k1 = (k0 + 0x9E3779B9) & mask, (k1 + 0xBB67AE85) & mask
    return ((c0 >> 11) * 2**32 + c1) * 2.0**-53
