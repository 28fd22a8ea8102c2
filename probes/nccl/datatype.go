package nccl

// DatatypeSize returns the size in bytes of one element of an
// ncclDataType_t, or 0 for an id NCCL does not define.
func DatatypeSize(dtype int32) uint64 {
	switch dtype {
	case 0, 1: // int8, uint8
		return 1
	case 2, 3: // int32, uint32
		return 4
	case 4, 5: // int64, uint64
		return 8
	case 6: // float16
		return 2
	case 7: // float32
		return 4
	case 8: // float64
		return 8
	case 9: // bfloat16
		return 2
	case 10, 11: // fp8 e4m3, e5m2
		return 1
	}
	return 0
}
