// Links two translation units that include every header: a non-inline function
// defined in a header would be a duplicate symbol here.
int odr_a();
int odr_b();
int main() { return (odr_a() == 2 && odr_b() == 2) ? 0 : 1; }
