// meshtrain: the command-line entry point. The commands and their help live in cli/commands.h; each
// command in its own file under cli/.
#include <iostream>
#include <string>
#include <vector>

#include "meshtrain/cli/commands.h"
#include "meshtrain/core/error.h"

int main(int argc, char** argv) {
  try {
    return meshtrain::run_command_line(std::vector<std::string>(argv + 1, argv + argc), std::cin, std::cout,
                                       std::cerr);
  } catch (const meshtrain::AlreadyReported& reported) {
    return reported.exit_code;
  } catch (const meshtrain::MeshError& error) {
    std::cerr << "meshtrain: error: " << error.what() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "meshtrain: internal error (please report it): " << error.what() << "\n";
    return 3;
  }
}
