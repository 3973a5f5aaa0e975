
Once upon a time"333?(%fff?R

2r1Btenant-a