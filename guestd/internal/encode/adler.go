package encode

import "encoding/binary"

// Adler-32 (RFC 1950) helpers. hash/adler32 is a byte-at-a-time loop; this
// version works on 8-byte words, skips runs of zeros in O(1) and can combine
// the checksums of independently hashed stripes.

const adlerMod = 65521

// adler32Update works on 8-byte words without the per-byte dependency chain
// of the textbook loop (about twice its speed). Over a block of n words,
// with bytes b[j][k] (word j, offset k) and word sums W[j]:
//
//	s1 += sum W[j]
//	s2 += 8n*s1 + 8*sum_j (n-1-j)*W[j] + sum_k (8-k)*B[k],  B[k] = sum_j b[j][k]
//
// B[k] accumulate in 16-bit lanes (even and odd bytes apart) and the middle
// term as a running sum of prefix sums. Horizontal sums of lanes are one
// multiply by 0x0001000100010001, which adds the four lanes into the top one
// (no lane carries while every lane stays below 2^16).
func adler32Update(adler uint32, p []byte) uint32 {
	const (
		lanes = 0x00ff00ff00ff00ff
		ones  = 0x0001000100010001
		// Words per block: 16-bit lanes take 257 additions of 255.
		blockWords = 256
	)
	s1, s2 := uint64(adler&0xffff), uint64(adler>>16)
	for len(p) >= 8 {
		n := min(len(p)/8, blockWords)
		q := p[: 8*n : 8*n]
		p = p[8*n:]
		var ae, ao, t, pre uint64
		for ; len(q) >= 32; q = q[32:] {
			w0 := binary.LittleEndian.Uint64(q)
			w1 := binary.LittleEndian.Uint64(q[8:16])
			w2 := binary.LittleEndian.Uint64(q[16:24])
			w3 := binary.LittleEndian.Uint64(q[24:32])
			e0, o0 := w0&lanes, w0>>8&lanes
			e1, o1 := w1&lanes, w1>>8&lanes
			e2, o2 := w2&lanes, w2>>8&lanes
			e3, o3 := w3&lanes, w3>>8&lanes
			ae += e0 + e1 + e2 + e3
			ao += o0 + o1 + o2 + o3
			v0, v1, v2 := e0+o0, e1+o1, e2+o2
			// Lanes stay below 2^16: at most 6*510 and 8*255.
			pre += 4*t + (3*v0+2*v1+v2)*ones>>48
			t += (v0 + v1 + v2 + e3 + o3) * ones >> 48
		}
		for ; len(q) >= 8; q = q[8:] {
			w := binary.LittleEndian.Uint64(q)
			e, o := w&lanes, w>>8&lanes
			ae += e
			ao += o
			pre += t
			t += (e + o) * ones >> 48
		}
		weighted := 8*(ae&0xffff) + 6*(ae>>16&0xffff) + 4*(ae>>32&0xffff) + 2*(ae>>48) +
			7*(ao&0xffff) + 5*(ao>>16&0xffff) + 3*(ao>>32&0xffff) + ao>>48
		s2 = (s2 + 8*uint64(n)*s1 + 8*pre + weighted) % adlerMod
		s1 = (s1 + t) % adlerMod
	}
	for _, c := range p {
		s1 += uint64(c)
		s2 += s1
	}
	return uint32(s2%adlerMod)<<16 | uint32(s1%adlerMod)
}

// adler32Zeros advances adler over n zero bytes.
func adler32Zeros(adler uint32, n int) uint32 {
	s1, s2 := uint64(adler&0xffff), uint64(adler>>16)
	s2 = (s2 + s1*uint64(n)) % adlerMod
	return uint32(s2)<<16 | uint32(s1)
}

// adler32Combine returns the checksum of A||B given adler(A), adler(B) and
// len(B) (zlib's adler32_combine).
func adler32Combine(a1, a2 uint32, len2 int) uint32 {
	rem := uint64(len2 % adlerMod)
	sum1 := uint64(a1 & 0xffff)
	sum2 := (rem * sum1) % adlerMod
	sum1 += uint64(a2&0xffff) + adlerMod - 1
	sum2 += uint64(a1>>16) + uint64(a2>>16) + adlerMod - rem
	if sum1 >= adlerMod {
		sum1 -= adlerMod
	}
	if sum1 >= adlerMod {
		sum1 -= adlerMod
	}
	if sum2 >= 2*adlerMod {
		sum2 -= 2 * adlerMod
	}
	if sum2 >= adlerMod {
		sum2 -= adlerMod
	}
	return uint32(sum2<<16 | sum1)
}
