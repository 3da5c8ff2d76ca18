// meshtrain command line (being built; see issues).
int main() { return 0; }
