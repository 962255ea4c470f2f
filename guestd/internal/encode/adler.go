package encode

// Adler-32 (RFC 1950) helpers. hash/adler32 is a byte-at-a-time loop; this
// version sums 8 bytes per step, skips runs of zeros in O(1) and can combine
// the checksums of independently hashed stripes.

const (
	adlerMod  = 65521
	adlerNMax = 5552 // largest n with 255n(n+1)/2 + (n+1)(mod-1) < 2^32
)

func adler32Update(adler uint32, p []byte) uint32 {
	s1, s2 := adler&0xffff, adler>>16
	for len(p) > 0 {
		n := len(p)
		if n > adlerNMax {
			n = adlerNMax
		}
		q := p[:n]
		p = p[n:]
		for len(q) >= 8 {
			b := q[:8:8]
			s1 += uint32(b[0])
			s2 += s1
			s1 += uint32(b[1])
			s2 += s1
			s1 += uint32(b[2])
			s2 += s1
			s1 += uint32(b[3])
			s2 += s1
			s1 += uint32(b[4])
			s2 += s1
			s1 += uint32(b[5])
			s2 += s1
			s1 += uint32(b[6])
			s2 += s1
			s1 += uint32(b[7])
			s2 += s1
			q = q[8:]
		}
		for _, c := range q {
			s1 += uint32(c)
			s2 += s1
		}
		s1 %= adlerMod
		s2 %= adlerMod
	}
	return s2<<16 | s1
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
