#!/usr/bin/python3
"""gen_palette.py — computes the policy palette of plots/plot.c: N colours placed one at a time by a greedy
farthest-point search in CIEDE2000 (Glasbey, van der Heijden, Toh and Gray, "Colour displays for categorical
images", Color Research & Application 32(4), 2007; the distance: Sharma, Wu and Dalal, Color Research &
Application 30(1), 2005). Candidates: the sRGB colours of a 16-level grid (steps of 0x11) with lightness L* in
[25, 70]; the search starts from matplotlib's tab10 blue, orange, green and red and keeps away from white, black
and the plot's greys (frontier #b8b8b8, turn shade #e6e6e6, turn line #555555). Prints the palette and the
smallest pairwise distance among the first k colours for a few k.

    /usr/bin/python3 tools/gen_palette.py 36
"""
import sys

import numpy as np


def lab(rgb):
    """CIELAB (D65) of sRGB triples 0..255 (last axis)."""
    c = np.asarray(rgb, float) / 255.0
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                  [0.0193339, 0.1191920, 0.9503041]])
    xyz = c @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 216 / 24389, np.cbrt(xyz), (24389 / 27 * xyz + 16) / 116)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


def de2000(l1, l2):
    """CIEDE2000 difference of Lab arrays (broadcasting), Sharma et al. Eqs. 1-22, angles in degrees."""
    L1, a1, b1 = l1[..., 0], l1[..., 1], l1[..., 2]
    L2, a2, b2 = l2[..., 0], l2[..., 1], l2[..., 2]
    cb = (np.hypot(a1, b1) + np.hypot(a2, b2)) / 2
    g = 0.5 * (1 - np.sqrt(cb**7 / (cb**7 + 25.0**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1 = np.where(c1p == 0, 0, np.degrees(np.arctan2(b1, a1p)) % 360)
    h2 = np.where(c2p == 0, 0, np.degrees(np.arctan2(b2, a2p)) % 360)
    dl, dc = L2 - L1, c2p - c1p
    dh = h2 - h1
    dh = np.where(dh > 180, dh - 360, np.where(dh < -180, dh + 360, dh))
    dh = np.where(c1p * c2p == 0, 0, dh)
    dhh = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    lb, cbp = (L1 + L2) / 2, (c1p + c2p) / 2
    hb = np.where(np.abs(h1 - h2) <= 180, (h1 + h2) / 2,
                  np.where(h1 + h2 < 360, (h1 + h2 + 360) / 2, (h1 + h2 - 360) / 2))
    hb = np.where(c1p * c2p == 0, h1 + h2, hb)
    t = (1 - 0.17 * np.cos(np.radians(hb - 30)) + 0.24 * np.cos(np.radians(2 * hb))
         + 0.32 * np.cos(np.radians(3 * hb + 6)) - 0.20 * np.cos(np.radians(4 * hb - 63)))
    dth = 30 * np.exp(-((hb - 275) / 25) ** 2)
    rc = 2 * np.sqrt(cbp**7 / (cbp**7 + 25.0**7))
    sl = 1 + 0.015 * (lb - 50) ** 2 / np.sqrt(20 + (lb - 50) ** 2)
    sc, sh = 1 + 0.045 * cbp, 1 + 0.015 * cbp * t
    rt = -np.sin(np.radians(2 * dth)) * rc
    return np.sqrt((dl / sl) ** 2 + (dc / sc) ** 2 + (dhh / sh) ** 2 + rt * (dc / sc) * (dhh / sh))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 36
    levels = np.arange(16) * 17
    grid = np.array([[r, g, b] for r in levels for g in levels for b in levels])
    grid_lab = lab(grid)
    ok = (grid_lab[:, 0] >= 25) & (grid_lab[:, 0] <= 70)
    cand, cand_lab = grid[ok], grid_lab[ok]
    chosen = [(0x1f, 0x77, 0xb4), (0xff, 0x7f, 0x0e), (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28)]
    avoid = [(255, 255, 255), (0, 0, 0), (0xb8, 0xb8, 0xb8), (0xe6, 0xe6, 0xe6), (0x55, 0x55, 0x55)]
    nearest = np.full(len(cand), np.inf)
    for c in avoid + chosen:
        nearest = np.minimum(nearest, de2000(cand_lab, lab(c)[None, :]))
    while len(chosen) < n:
        k = int(np.argmax(nearest))  # the first of equals: grid order, deterministic
        chosen.append(tuple(int(x) for x in cand[k]))
        nearest = np.minimum(nearest, de2000(cand_lab, cand_lab[k][None, :]))
    print(", ".join('"#%02x%02x%02x"' % c for c in chosen))
    chosen_lab = lab(np.array(chosen))
    for k in sorted({21, 24, 28, 32, n} & set(range(2, n + 1))):
        d = min(de2000(chosen_lab[i], chosen_lab[j]) for i in range(k) for j in range(i))
        print("first %d: smallest pairwise CIEDE2000 %.2f" % (k, d))


if __name__ == "__main__":
    main()
