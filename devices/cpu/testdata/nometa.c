// A shared object that is not a kiln module.
int nothing(void) { return 0; }
