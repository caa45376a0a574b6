package postgres

import (
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// compressAbove is the body size from which a stored response is compressed.
const compressAbove = 1024

// encodingZstd marks a stored body as zstd-compressed.
const encodingZstd = "zstd"

var (
	// One encoder and decoder for the process: EncodeAll and DecodeAll are
	// safe for concurrent use.
	zstdEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	zstdDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(64<<20))
)

// encodeBody returns the body to store and its encoding: bodies over 1 KiB
// are compressed when that makes them smaller, others are kept as they are
// (encoding nil).
func encodeBody(body []byte) ([]byte, *string) {
	if len(body) <= compressAbove {
		return body, nil
	}
	compressed := zstdEncoder.EncodeAll(body, make([]byte, 0, len(body)/2))
	if len(compressed) >= len(body) {
		return body, nil
	}
	enc := encodingZstd
	return compressed, &enc
}

// decodeBody reverses encodeBody.
func decodeBody(stored []byte, encoding *string) ([]byte, error) {
	if encoding == nil {
		return stored, nil
	}
	if *encoding != encodingZstd {
		return nil, fmt.Errorf("stored body has unknown encoding %q", *encoding)
	}
	body, err := zstdDecoder.DecodeAll(stored, nil)
	if err != nil {
		return nil, fmt.Errorf("decompress stored body: %w", err)
	}
	return body, nil
}
