package decide

// HoldingDenials returns how many local denials of s wait for their keys
// (holdDenial), for the tests of package decide_test to wait on.
func HoldingDenials(s *Service) int64 { return s.holding.Load() }
